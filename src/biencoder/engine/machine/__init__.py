"""The machine a run is on, decided once per run and passed down: seed, device, precision, determinism and progress
bars (:mod:`~biencoder.engine.machine.runtime`, the :class:`~biencoder.engine.machine.runtime.Runtime` record), the
DDP process group (:mod:`~biencoder.engine.machine.distributed`) and the random generators' states that ``last.pt``
saves (:mod:`~biencoder.engine.machine.rng`); and the rounding of a float32 matrix product as torch is set, which the
exact search allows for (:mod:`~biencoder.engine.machine.precision`)."""
