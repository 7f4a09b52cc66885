"""The data a run learns from and is scored on: the ArguAna folders on disk (:mod:`~biencoder.engine.data.arguana`),
query -> positive pair files (:mod:`~biencoder.engine.data.pair_files`; each file read and checked by
:mod:`~biencoder.engine.data.pair_records`), the paired splits either reader makes
(:mod:`~biencoder.engine.data.paired`) and the corpus as tables with its deduplication, overlap and the one definition
of which pairs a run uses (:mod:`~biencoder.engine.data.corpus`)."""
