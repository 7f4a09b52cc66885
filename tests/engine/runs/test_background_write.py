"""``last.pt`` off the training path: :meth:`RunFolder.save_state` copies the state and writes it in a thread
(:class:`biencoder.engine.files.BackgroundWriter`). The copy is the caller's state as it was when submitted, one write
is in flight at a time, a failed write's error reaches the caller, and everything that must see a finished
``last.pt`` (the end of a run, a failed run) waits for it. The kill during a write: ``tests/project/
test_reliability.py``."""

import json
import threading
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch

from biencoder.engine import files
from biencoder.engine.files import BackgroundWriter, HostCopier, host_copy
from biencoder.engine.runs import folder as folder_module
from biencoder.engine.runs.folder import RunFolder
from conftest import FAST, compose_cfg


class Gate:
    """Replaces ``files.save_atomic`` (what the writer thread calls): each write waits until :meth:`open` (or
    ``delay`` seconds), records how many writes ran at once, and logs ``"<name> written"`` to ``events`` after the
    real write."""

    def __init__(self, monkeypatch, events: list, delay: float | None = None, error: BaseException | None = None):
        self.events, self.delay, self.error = events, delay, error
        self.released, self.entered = threading.Event(), threading.Event()
        self.running = self.most = self.calls = 0
        self.threads: list[threading.Thread] = []
        self.saved: list = []  # what each write left in the file
        self.real = files.save_atomic
        monkeypatch.setattr(files, "save_atomic", self.save)

    def save(self, obj, path):
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        self.threads.append(threading.current_thread())
        self.entered.set()
        try:
            if self.delay is not None:
                time.sleep(self.delay)
            else:
                assert self.released.wait(30), "the test never opened the gate"
            if self.error is not None:
                raise self.error
            self.real(obj, path)
            self.events.append(f"{path.name} written")
            self.saved.append(torch.load(path, weights_only=True))
        finally:
            self.running -= 1

    def open(self):
        self.released.set()


def a_state():
    hits = np.arange(6, dtype=np.int64)
    return {
        "epoch": 3,
        "model": OrderedDict(w=torch.arange(12, dtype=torch.float32).reshape(3, 4), b=torch.ones(4)),
        "optimizer": {"state": {0: {"exp_avg": torch.full((3, 4), 0.5), "step": torch.tensor(7.0)}}, "lr": [1e-3]},
        "rng": [{"python": (3, (1, 2, 3), None), "torch": torch.ByteTensor([1, 2, 3])}],
        "best": {"hits": torch.from_numpy(hits), "metrics": {"val": {"top1": 0.5}}},
    }, hits


def expected(state):
    """A deep copy made before anything changes (what the file must hold)."""
    return {
        "epoch": state["epoch"],
        "w": state["model"]["w"].clone(),
        "b": state["model"]["b"].clone(),
        "exp_avg": state["optimizer"]["state"][0]["exp_avg"].clone(),
        "step": state["optimizer"]["state"][0]["step"].clone(),
        "lr": list(state["optimizer"]["lr"]),
        "rng_torch": state["rng"][0]["torch"].clone(),
        "hits": state["best"]["hits"].clone(),
        "top1": state["best"]["metrics"]["val"]["top1"],
    }


def assert_holds(saved, want):
    assert saved["epoch"] == want["epoch"]
    assert torch.equal(saved["model"]["w"], want["w"]) and torch.equal(saved["model"]["b"], want["b"])
    assert torch.equal(saved["optimizer"]["state"][0]["exp_avg"], want["exp_avg"])
    assert torch.equal(saved["optimizer"]["state"][0]["step"], want["step"])
    assert saved["optimizer"]["lr"] == want["lr"]
    assert torch.equal(saved["rng"][0]["torch"], want["rng_torch"])
    assert torch.equal(saved["best"]["hits"], want["hits"])
    assert saved["best"]["metrics"]["val"]["top1"] == want["top1"]


def test_the_write_holds_the_state_as_it_was_when_submitted(tmp_path, monkeypatch):
    """The caller changes every tensor, array and container of the state in place while the write is held: the
    file still holds the values submitted, and save_state returned before the write ran (in another thread)."""
    gate = Gate(monkeypatch, [])
    folder = RunFolder(tmp_path)
    state, hits = a_state()
    want = expected(state)
    folder.save_state(state)
    assert gate.entered.wait(10) and not folder.last.exists()  # returned while the write is held
    with torch.no_grad():  # what training does to them next: in place
        state["model"]["w"].add_(100.0)
        state["model"]["b"].zero_()
        state["optimizer"]["state"][0]["exp_avg"].mul_(-1)
        state["optimizer"]["state"][0]["step"] += 1
    state["optimizer"]["lr"][0] = 9.0
    state["rng"][0]["torch"][:] = 0
    hits[:] = -1  # the numpy array behind best's hits tensor
    state["best"]["metrics"]["val"]["top1"] = 0.0
    state["epoch"] = 4
    gate.open()
    folder.last_writer.wait()
    assert gate.threads and threading.main_thread() not in gate.threads
    assert_holds(torch.load(folder.last, weights_only=True), want)


def test_host_copy_shares_no_memory_and_keeps_types():
    base = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    view = base.t()[1:3]  # not contiguous, an offset into base's storage
    params = OrderedDict(view=view, flag=torch.tensor(True))
    params._metadata = {"": {"version": 1}}  # as nn.Module.state_dict() returns it
    array = np.ones(3)
    state = {"params": params, "array": array, "size": torch.Size([2, 3]), "rng": (3, (1, 2), None), "n": [1, 2.5]}
    copied = host_copy(state)
    assert type(copied["params"]) is OrderedDict and copied["params"]._metadata == params._metadata
    out = copied["params"]["view"]
    assert out.dtype == torch.bfloat16 and out.shape == view.shape and torch.equal(out, view)
    assert out.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert copied["params"]["flag"].item() is True
    assert copied["array"] is not array and np.array_equal(copied["array"], array)
    assert copied["size"] == torch.Size([2, 3]) and copied["rng"] == (3, (1, 2), None) and copied["n"] == [1, 2.5]
    assert copied["n"] is not state["n"] and copied["params"] is not params
    with pytest.raises(TypeError, match="set"):
        host_copy({"odd": {1, 2}})


def test_a_copier_reuses_memory_only_after_release():
    """Copies made since the last release keep their values while later copies are made; after release() a copy of
    the same shapes goes into the same memory, with the new values."""
    copier = HostCopier()
    first = copier.copy({"w": torch.ones(4, 3)})
    second = copier.copy({"w": torch.full((4, 3), 2.0)})
    assert torch.equal(first["w"], torch.ones(4, 3))  # not overwritten: first was never released
    assert second["w"].data_ptr() != first["w"].data_ptr()
    copier.release()
    third = copier.copy({"w": torch.full((4, 3), 3.0), "b": torch.zeros(3)})
    assert third["w"].data_ptr() in {first["w"].data_ptr(), second["w"].data_ptr()}
    assert torch.equal(third["w"], torch.full((4, 3), 3.0)) and torch.equal(third["b"], torch.zeros(3))


@pytest.mark.slow
def test_one_write_at_a_time_and_the_later_state_wins(tmp_path, monkeypatch):
    """A second save_state while the first write is held waits for it; the file then holds the second state."""
    events = []
    gate = Gate(monkeypatch, events)
    folder = RunFolder(tmp_path)
    first, _ = a_state()
    second, _ = a_state()
    second["epoch"] = 4
    second["model"]["w"] += 1
    folder.save_state(first)
    assert gate.entered.wait(10)
    submitter = threading.Thread(target=folder.save_state, args=(second,))
    submitter.start()
    submitter.join(0.3)
    assert submitter.is_alive() and gate.calls == 1  # waiting for the first write, not writing beside it
    gate.open()
    submitter.join(10)
    folder.last_writer.wait()
    assert gate.most == 1 and gate.calls == 2 and events == ["last.pt written", "last.pt written"]
    # each write holds its own state (the second copy reuses the first's memory only after the first write ended)
    assert [saved["epoch"] for saved in gate.saved] == [3, 4]
    assert torch.equal(gate.saved[0]["model"]["w"], first["model"]["w"])
    assert torch.equal(gate.saved[1]["model"]["w"], second["model"]["w"])
    assert torch.load(folder.last, weights_only=True)["epoch"] == 4


def test_a_failed_write_is_raised_by_the_next_wait_once(tmp_path, monkeypatch):
    Gate(monkeypatch, [], delay=0.0, error=OSError(28, "No space left on device"))
    folder = RunFolder(tmp_path)
    state, _ = a_state()
    folder.save_state(state)  # the error happens in the thread
    with pytest.raises(OSError, match="No space left"):
        folder.last_writer.wait()
    folder.last_writer.wait()  # raised once
    folder.save_state(state)
    with pytest.raises(OSError, match="No space left"):
        folder.save_state(state)  # the next checkpoint waits for the failed one first
    assert not folder.last.exists()


@pytest.mark.slow
@pytest.mark.parametrize("keep_last", [False, True])
def test_finish_waits_for_the_write_then_vouches_for_it(tmp_path, monkeypatch, keep_last):
    """final.json comes after the last.pt write in flight ends; with keep_last=false last.pt is gone afterwards
    (removed after the write, not before it and then renamed back into place)."""
    events = []
    Gate(monkeypatch, events, delay=0.3)
    real_json = folder_module.write_json_atomic
    monkeypatch.setattr(
        folder_module,
        "write_json_atomic",
        lambda path, obj: (events.append(f"{path.name} written"), real_json(path, obj)),
    )
    folder = RunFolder(tmp_path)
    state, _ = a_state()
    folder.save_state(state)
    folder.finish({"status": "done"}, {"test_hits": np.arange(3)}, None, keep_last=keep_last)
    folder.last_writer.wait()  # nothing in flight any more: whatever the write would still do, it did
    assert events == ["last.pt written", "final.json written"]
    assert folder.last.exists() == keep_last and not list(tmp_path.glob(".last.pt.*"))
    assert json.loads(folder.final.read_text()) == {"status": "done"}


@pytest.mark.slow
def test_a_block_that_fails_waits_for_the_write_and_keeps_its_own_error(tmp_path, monkeypatch, caplog):
    """waiting_on_error: the block's exception propagates after the write in flight ended (the file is there when
    it arrives); when that write failed too, its error is logged, not raised in place of the block's."""
    Gate(monkeypatch, [], delay=0.3)
    writer = BackgroundWriter(tmp_path / "last.pt")
    with pytest.raises(ValueError, match="the run's own"), writer.waiting_on_error():
        writer.submit({"epoch": 0})
        raise ValueError("the run's own error")
    assert torch.load(tmp_path / "last.pt", weights_only=True) == {"epoch": 0}
    Gate(monkeypatch, [], delay=0.3, error=OSError(28, "No space left on device"))
    with pytest.raises(ValueError, match="the run's own"), writer.waiting_on_error():
        writer.submit({"epoch": 1})
        raise ValueError("the run's own error")
    assert "writing" in caplog.text and "No space left" in caplog.text
    writer.wait()  # reported once, there


def test_a_writer_of_another_file_is_independent(tmp_path):
    writer = BackgroundWriter(tmp_path / "other.pt")
    writer.wait()  # nothing submitted: returns
    writer.submit({"x": torch.ones(2)})
    writer.wait()
    assert torch.equal(torch.load(tmp_path / "other.pt", weights_only=True)["x"], torch.ones(2))


# -- through the runner -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 2])
def test_a_run_whose_last_pt_write_fails_ends_failed_with_that_error(tmp_path, monkeypatch, epochs):
    """The write of epoch 0's last.pt fails in its thread: the run fails with that error, raised at the next
    checkpoint (2 epochs) or at the end (1 epoch), and final.json says failed, not done."""
    from biencoder.engine.training.run import run

    Gate(monkeypatch, [], delay=0.0, error=OSError(28, "No space left on device"))
    out = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        run(compose_cfg(FAST + [f"trainer.max_epochs={epochs}", "eval.tasks=false"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "failed" and "No space left" in final["error"]
    assert not (out / "last.pt").exists() and not (out / "best.pt").exists()


@pytest.mark.slow
def test_a_failed_run_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    """The run fails in epoch 1 while epoch 0's last.pt is still being written: the write ends before final.json
    says failed, and last.pt holds epoch 0 when the run has ended."""
    from biencoder.engine.training.run import run
    from biencoder.engine.training.runner import Runner

    events = []
    Gate(monkeypatch, events, delay=1.0)
    real_json = folder_module.write_json_atomic
    monkeypatch.setattr(
        folder_module,
        "write_json_atomic",
        lambda path, obj: (events.append(f"{path.name} written"), real_json(path, obj)),
    )
    run_epoch = Runner.run_epoch

    def stopped_at_1(self, epoch, *args):
        if epoch == 1:
            raise KeyboardInterrupt
        return run_epoch(self, epoch, *args)

    monkeypatch.setattr(Runner, "run_epoch", stopped_at_1)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(compose_cfg(FAST + ["trainer.max_epochs=3", "eval.tasks=false"]), out)
    assert events == ["last.pt written", "final.json written"]
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 0
    assert json.loads((out / "final.json").read_text())["status"] == "failed"
