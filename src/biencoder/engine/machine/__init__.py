"""The machine a run is on, decided once per run and passed down: seed, device, precision, determinism and progress
bars (:mod:`~biencoder.engine.machine.runtime`, the :class:`~biencoder.engine.machine.runtime.Runtime` record), the
DDP process group (:mod:`~biencoder.engine.machine.distributed`) and the random generators' states that ``last.pt``
saves (:mod:`~biencoder.engine.machine.rng`)."""
