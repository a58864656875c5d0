"""inference.operations.swap on stand-in runtimes in a registry: a failed load leaves the old model serving, a swap
that does not fit beside drains the old model first (requests wait, then 503 model_not_loaded), a swap is a load
under the registry's lock and memory budget (idle models unloaded least recently used first, refused before
anything drains when it cannot fit), and the served-model row is followed where it was made over this server's
configured default."""
import threading

import pytest

from inference.operations import runtime, swap
from inference.operations.registry import LOADED, UNLOADED, ModelBudgetBusy, ModelLoadFailed
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
def serving(fake_rt):
    return fake_rt


def swapping(old, beside=True, **models):
    """A registry serving `old` whose loader has `models` (name -> runtime, factory or exception); `beside`:
    whether the machine's memory holds a new model beside the old (the loader's fits_beside)."""
    fail = {k: v for k, v in models.items() if isinstance(v, Exception)}
    loader = FakeLoader({old.model_id: old, **{k: v for k, v in models.items() if k not in fail}}, fail=fail,
                        beside=beside)
    return serving_registry(registry_of(old, loader=loader))


def test_a_failed_load_leaves_the_old_model_serving(serving, tmp_path):
    with swapping(serving, next=OSError("no such folder")) as registry:
        with pytest.raises(OSError):
            swap.swap_model(str(tmp_path / "next"), "next")
        assert registry.runtime() is serving
        assert swap.status(registry)["state"] == "failed" and "no such folder" in swap.status(registry)["error"]
        health = call("GET", "/health").json()
        assert health["model"] == serving.model_id and health["swap"]["state"] == "failed"


def test_a_swap_beside_installs_the_new_model_and_stops_the_old_once_idle(serving, tmp_path):
    old = fake_runtime("old", tmp_path / "old")
    new = fake_runtime("next", tmp_path / "next")
    with swapping(old, next=new) as registry:
        old.engine.busy = True
        assert swap.swap_model(str(tmp_path / "next"), "next") is new
        assert registry.runtime() is new and registry.loader.released == []  # still draining
        assert call("GET", "/v1/models").json()["data"][0]["id"] == "next"
        assert registry.names() == ["next"] and registry.default().pinned  # its place, pin and keep_alive
        old.engine.busy = False
        for thread in threading.enumerate():
            if thread.name == "metrale-drain-old":
                thread.join(5)
        assert registry.loader.released == ["old"]


def test_a_swap_that_does_not_fit_drains_first_and_answers_503_past_the_wait(serving, tmp_path, settings):
    settings.METRALE = {**settings.METRALE, "SWAP_WAIT_S": 0}
    old = fake_runtime("old", tmp_path / "old")
    seen = {}
    stopped = []

    def load():
        stopped.extend(registry.loader.released)  # the old one drained and stopped before the new one loads
        seen["chat"] = call("POST", "/v1/chat/completions", {"model": "old", "messages": [{"role": "user",
                                                                                            "content": "hi"}]})
        seen["health"] = call("GET", "/health")
        return fake_runtime("next", tmp_path / "next")

    with swapping(old, beside=False, next=load) as registry:
        swap.swap_model(str(tmp_path / "next"), "next")
        assert stopped == ["old"]
        assert seen["chat"].status == 503 and seen["chat"].json()["error"]["code"] == "model_not_loaded"
        assert seen["chat"].headers["retry-after"] == "5"
        assert seen["health"].status == 503 and seen["health"].json()["status"] == "swapping"
        assert registry.runtime().model_id == "next" and runtime.status() == ("ready", None)


@pytest.mark.parametrize("wait_max, served", [(8, True), (0, False)])
def test_a_request_during_a_drain_first_swap_waits_for_the_new_model(serving, tmp_path, settings, wait_max, served):
    """A request that arrives while no model is installed waits (bounded) and runs on the new one."""
    settings.METRALE = {**settings.METRALE, "SWAP_WAIT_S": 30, "SWAP_WAIT_MAX": wait_max}
    old = fake_runtime(serving.model_id, tmp_path / "old")
    loading, release = threading.Event(), threading.Event()

    def load():
        loading.set()
        assert release.wait(10)
        return serving

    with swapping(old, beside=False, next=load) as registry:
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


def budgeted(tmp_path, loaded: dict, *, others=(), budget=100, **kw):
    """A registry whose default chat model is the first of `loaded` (name -> resident bytes, each a loaded
    stand-in, in load order: the first is the least recently used), `others` configured but unloaded, and
    "next" to swap in; estimates equal sizes (kw: "next"'s size, load_wait_s, beside)."""
    from inference.operations.model_specs import CHAT, ModelSpec
    from inference.operations.registry import ModelRegistry

    sizes = {**loaded, **dict.fromkeys(others, 40), "next": kw.pop("next", 40)}
    runtimes = {name: fake_runtime(name, tmp_path / name) for name in sizes}
    loader = FakeLoader(runtimes, sizes=sizes, estimates=sizes, beside=kw.pop("beside", True))
    specs = [ModelSpec(name, tmp_path / name, CHAT) for name in [*loaded, *others]]
    registry = ModelRegistry(specs, loader, budget_bytes=budget, load_wait_s=kw.pop("load_wait_s", 0.2), **kw)
    for name in loaded:
        registry.load(name).result(5)
    return registry, runtimes


def test_a_swap_unloads_the_least_recently_used_idle_model_to_load_beside_the_old_one(serving, tmp_path):
    registry, models = budgeted(tmp_path, {"old": 40, "b": 40, "c": 40}, budget=130)
    with serving_registry(registry):
        assert swap.swap_model(str(tmp_path / "next"), "next") is models["next"]
    assert registry.entries["b"].state == UNLOADED and registry.entries["c"].state == LOADED  # b: used least lately
    assert registry.loader.released[0] == "b" and registry.runtime() is models["next"]
    assert registry.loader.loads == ["old", "b", "c", "next"]


def test_a_swap_that_fits_only_in_the_old_model_s_place_drains_it_first(serving, tmp_path):
    registry, models = budgeted(tmp_path, {"old": 40, "b": 40}, next=50)
    hold = registry.acquire_blocking(registry.entries["b"])  # b busy: it cannot make room
    order = []
    models["next"] = lambda: order.extend(registry.loader.released) or fake_runtime("next", tmp_path / "next")
    registry.loader.models["next"] = models["next"]
    with serving_registry(registry):
        swap.swap_model(str(tmp_path / "next"), "next")
    hold.release()
    assert order == ["old"]  # stopped before the new model loaded: 40 + 50 fit, 80 + 50 do not
    assert registry.runtime().model_id == "next" and registry.resident_bytes() == 90


@pytest.mark.parametrize("size, refusal, cause", [(500, ModelLoadFailed, "budget (METRALE_MEMORY_BUDGET) is 0 MB"),
                                                   (70, ModelBudgetBusy, "busy or pinned (b)")])
def test_a_swap_that_cannot_fit_is_refused_before_anything_drains(serving, tmp_path, size, refusal, cause):
    registry, models = budgeted(tmp_path, {"old": 40, "b": 40}, next=size)
    hold = registry.acquire_blocking(registry.entries["b"])  # 40 + 70 over 100 even with the old one gone
    with serving_registry(registry), pytest.raises(refusal) as refused:
        swap.swap_model(str(tmp_path / "next"), "next")
    hold.release()
    assert type(refused.value) is refusal and refused.value.model == "next" and cause in refused.value.cause
    assert registry.loader.loads == ["old", "b"] and registry.loader.released == []
    assert registry.runtime() is models["old"] and registry.entries["old"].unavailable is None
    assert swap.status(registry)["state"] == "failed" and cause in swap.status(registry)["error"]


def test_a_swap_holds_the_registry_s_load_lock_and_the_replaced_model_counts_until_it_drains(serving, tmp_path):
    import concurrent.futures

    registry, models = budgeted(tmp_path, {"old": 40}, others=["c"], budget=100)
    during = {}

    def load_next():
        during["c"] = registry.load("c")  # an on-demand load asked for while the swap loads
        with pytest.raises(concurrent.futures.TimeoutError):
            during["c"].result(0.3)
        return fake_runtime("next", tmp_path / "next")

    registry.loader.models["next"] = load_next
    models["old"].engine.busy = True  # a request still runs on the old model
    with serving_registry(registry):
        swap.swap_model(str(tmp_path / "next"), "next")
    # c's load ran after the swap's, and found the old model (draining, 40) beside the new one (40): no room.
    with pytest.raises(ModelBudgetBusy, match="1 replaced model"):
        during["c"].result(5)
    assert registry.loader.loads == ["old", "next"] and registry.resident_bytes() == 80
    models["old"].engine.busy = False
    for thread in threading.enumerate():
        if thread.name == "metrale-drain-old":
            thread.join(5)
    assert registry.resident_bytes() == 40 and registry.loader.released == ["old"]
    assert registry.load("c").result(5) is models["c"] and registry.resident_bytes() == 80
