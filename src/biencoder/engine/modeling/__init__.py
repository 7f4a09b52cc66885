"""The bi-encoder and what trains it: ``BiModel`` (a shared encoder, the 128-d sim head and the pair classifier with
its ``use_layernorm``/``use_relu`` flags: :mod:`~biencoder.engine.modeling.model`), running texts through it
(tokenised texts, encoding, the one way to get pooled vectors, the classifier's margins:
:mod:`~biencoder.engine.modeling.encoding`), the on-disk embedding cache of a frozen encoder
(:mod:`~biencoder.engine.modeling.cache`) and the two losses (:mod:`~biencoder.engine.modeling.loss`)."""
