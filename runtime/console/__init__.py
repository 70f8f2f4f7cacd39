"""The operations console: a web app over the client's admin calls (``raytxn console``), and the
Grafana dashboards of the engine's metrics (``raytxn console grafana``).

* ``data``: the admin calls a page makes, with the logged-in user's token, and the stats
  snapshot every page shares (refreshed in the background, bounded in calls).
* ``pages``: the routes, each rendering a Jinja2 template (``templates/``), and the 4xx pages
  of bad input and refusals.
* ``app``: the Starlette app, logins and sessions, and the Ray actor serving it.
* ``grafana``: dashboards generated from code, as Ray generates its own.

It is a tool over the client (the import contracts place it beside ``raytxn.tools``): it calls
the engine's actors only as a client does, and holds no rights of its own.
"""
