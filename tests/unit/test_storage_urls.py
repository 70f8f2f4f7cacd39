"""Which store each storage URL opens. GCS and Azure cannot run here (no emulator on this
machine), so these check only that their URLs build the right obstore store, bucket and prefix;
the S3, file and memory paths run against real stores in tests/integration/test_ledger.py."""

from __future__ import annotations

import pytest
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

from raytxn.errors import InvalidArgument
from raytxn.ledger.storage import Storage


def test_each_scheme_opens_its_store(tmp_path: object) -> None:
    assert isinstance(Storage.from_url("memory://urls").store, MemoryStore)
    assert isinstance(Storage.from_url(f"file://{tmp_path}").store, LocalStore)
    s3 = Storage.from_url("s3://raytxn-data/prod/eu", endpoint="http://127.0.0.1:1", allow_http=True)
    assert isinstance(s3.store, S3Store) and s3.store.prefix == "prod/eu"
    gcs = Storage.from_url("gs://raytxn-data/prod")
    assert isinstance(gcs.store, GCSStore) and str(gcs.store.prefix) == "prod"
    assert gcs.store.config["bucket"] == "raytxn-data"
    azure = Storage.from_url("az://ledgers/prod", account_name="raytxnacct")
    assert isinstance(azure.store, AzureStore) and str(azure.store.prefix) == "prod"
    assert azure.store.config["container_name"] == "ledgers"


@pytest.mark.parametrize("url", ["gs:///no-bucket", "az:///x", "s3:///x", "ftp://host/x", "hdfs://nn/x"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        Storage.from_url(url)
