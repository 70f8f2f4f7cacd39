// Pages refresh on their own: the element with data-refresh-ms is fetched again (the same URL
// with ?fragment=1, which the server renders as that block alone) and swapped in. Nothing
// refreshes while the tab is hidden; a session that ended sends the page to the login.
(function () {
  const live = document.querySelector("[data-refresh-ms]");
  if (!live) return;
  const every = Number(live.dataset.refreshMs) || 2000;
  const stamp = document.getElementById("updated");
  async function tick() {
    if (!document.hidden) {
      const url = new URL(window.location.href);
      url.searchParams.set("fragment", "1");
      try {
        const response = await fetch(url, {credentials: "same-origin", cache: "no-store"});
        if (response.status === 401) { window.location.reload(); return; }
        live.innerHTML = await response.text();
        live.dataset.refreshes = String(Number(live.dataset.refreshes || 0) + 1);
        if (stamp) stamp.textContent = "updated " + new Date().toLocaleTimeString();
      } catch (error) {
        if (stamp) stamp.textContent = "console unreachable: retrying";
      }
    }
    window.setTimeout(tick, every);
  }
  window.setTimeout(tick, every);
})();
