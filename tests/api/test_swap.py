"""inference.operations.swap on stand-in runtimes in a registry: a failed load leaves the old model serving, a swap
that does not fit drains the old model first (requests wait, then 503 model_not_loaded), and the served-model
row is followed where it was made over this server's configured default."""
import threading

import pytest

from inference.operations import runtime, swap
from inference.operations.registry import serving as serving_registry

from .fake_engine import call
from .registries import FakeLoader, registry_of


class _Engine:
    """What swap reads of an AsyncEngine: idle, stop."""

    max_model_len = 2048

    def __init__(self):
        self.stopped, self.busy = False, False

    def idle(self):
        return not self.busy

    def stop(self):
        self.stopped = True


def fake_runtime(name, path):
    return runtime.Runtime(_Engine(), None, name, path, 0, fingerprint=f"fp_{name}")


@pytest.fixture
def serving(monkeypatch, fake_rt):
    monkeypatch.setattr(swap, "fits_beside", lambda path, old: True)
    monkeypatch.setattr(swap, "_status", dict(swap._status))
    return fake_rt


def swapping(old, **models):
    """A registry serving `old` whose loader has `models` (name -> runtime, factory or exception)."""
    fail = {k: v for k, v in models.items() if isinstance(v, Exception)}
    loader = FakeLoader({old.model_id: old, **{k: v for k, v in models.items() if k not in fail}}, fail=fail)
    return serving_registry(registry_of(old, loader=loader))


def test_a_failed_load_leaves_the_old_model_serving(serving, tmp_path):
    with swapping(serving, next=OSError("no such folder")) as registry:
        with pytest.raises(OSError):
            swap.swap_model(str(tmp_path / "next"), "next")
        assert registry.runtime() is serving
        assert swap.status()["state"] == "failed" and "no such folder" in swap.status()["error"]
        health = call("GET", "/health").json()
        assert health["model"] == serving.model_id and health["swap"]["state"] == "failed"


def test_a_swap_beside_installs_the_new_model_and_stops_the_old_once_idle(serving, tmp_path):
    old = fake_runtime("old", tmp_path / "old")
    new = fake_runtime("next", tmp_path / "next")
    with swapping(old, next=new) as registry:
        old.engine.busy = True
        assert swap.swap_model(str(tmp_path / "next"), "next") is new
        assert registry.runtime() is new and not old.engine.stopped  # still draining
        assert call("GET", "/v1/models").json()["data"][0]["id"] == "next"
        assert registry.names() == ["next"] and registry.default().pinned  # its place, pin and keep_alive
        old.engine.busy = False
        for thread in threading.enumerate():
            if thread.name == "metrale-drain-old":
                thread.join(5)
        assert old.engine.stopped


def test_a_swap_that_does_not_fit_drains_first_and_answers_503_past_the_wait(serving, monkeypatch, tmp_path,
                                                                           settings):
    settings.METRALE = {**settings.METRALE, "SWAP_WAIT_S": 0}
    old = fake_runtime("old", tmp_path / "old")
    monkeypatch.setattr(swap, "fits_beside", lambda path, old: False)
    seen = {}

    def load():
        assert old.engine.stopped  # the old one drained and stopped before the new one loads
        seen["chat"] = call("POST", "/v1/chat/completions", {"model": "old", "messages": [{"role": "user",
                                                                                            "content": "hi"}]})
        seen["health"] = call("GET", "/health")
        return fake_runtime("next", tmp_path / "next")

    with swapping(old, next=load) as registry:
        swap.swap_model(str(tmp_path / "next"), "next")
        assert seen["chat"].status == 503 and seen["chat"].json()["error"]["code"] == "model_not_loaded"
        assert seen["chat"].headers["retry-after"] == "5"
        assert seen["health"].status == 503 and seen["health"].json()["status"] == "swapping"
        assert registry.runtime().model_id == "next" and runtime.status() == ("ready", None)


@pytest.mark.parametrize("wait_max, served", [(8, True), (0, False)])
def test_a_request_during_a_drain_first_swap_waits_for_the_new_model(serving, monkeypatch, tmp_path, settings,
                                                                    wait_max, served):
    """A request that arrives while no model is installed waits (bounded) and runs on the new one."""
    settings.METRALE = {**settings.METRALE, "SWAP_WAIT_S": 30, "SWAP_WAIT_MAX": wait_max}
    old = fake_runtime(serving.model_id, tmp_path / "old")
    monkeypatch.setattr(swap, "fits_beside", lambda path, old: False)
    loading, release = threading.Event(), threading.Event()

    def load():
        loading.set()
        assert release.wait(10)
        return serving

    with swapping(old, **{"next": load}) as registry:
        swapper = threading.Thread(target=swap.swap_model, args=(str(tmp_path / "next"), "next"))
        swapper.start()
        assert loading.wait(10) and runtime.status()[0] == "swapping"
        threading.Timer(0.3, release.set).start()
        answer = call("POST", "/v1/chat/completions", {"model": serving.model_id, "max_tokens": 2,
                                                        "messages": [{"role": "user", "content": "hi"}]})
        release.set()
        swapper.join(10)
        if served:
            assert answer.status == 200, answer.body
            assert serving.engine.submissions, "the request ran on the new model"
        else:
            assert answer.status == 503 and answer.json()["error"]["code"] == "model_not_loaded"
        assert registry.runtime() is serving


def test_servers_follow_the_served_model_row_made_over_their_configured_default(serving, tmp_path, db, caplog):
    from adapters import swap_watch
    from adapters.models import ServedModel

    new = fake_runtime("next", tmp_path / "next")
    with swapping(serving, next=new) as registry:
        assert swap_watch.follow_once(None) is None  # no row: nothing to do
        ServedModel.objects.create(pk=1, path=str(tmp_path / "next"), served_name="next",
                                   configured="/elsewhere/another-default")
        with caplog.at_level("WARNING"):
            assert swap_watch.chosen_model() is None and swap_watch.follow_once(None) is None
        assert registry.runtime() is serving  # made over another configured default: the configuration wins
        assert "configuration wins" in caplog.text
        ServedModel.objects.filter(pk=1).update(configured=swap_watch.configured_default())
        assert swap_watch.chosen_model() == (str(tmp_path / "next"), "next")
        assert swap_watch.follow_once(None) is None
        row = ServedModel.objects.get(pk=1)
        assert registry.runtime() is new and row.state == "serving" and row.fingerprint == "fp_next"
        ServedModel.objects.filter(pk=1).update(path=str(tmp_path / "broken"), served_name="broken", state="pending")
        registry.loader.fail["broken"] = OSError("bad")
        failed = swap_watch.follow_once(None)
        assert failed is not None and ServedModel.objects.get(pk=1).state == "failed"
        assert swap_watch.follow_once(failed) == failed  # not retried until asked again
        assert registry.runtime() is new
