"""The bi-encoder and what trains it: ``BiModel`` (a shared encoder, the 128-d sim head and the pair classifier with
its ``use_layernorm``/``use_relu`` flags), tokenised texts and the one way to get pooled vectors
(:mod:`~biencoder.engine.modeling.model`), the on-disk embedding cache of a frozen encoder
(:mod:`~biencoder.engine.modeling.cache`) and the two losses (:mod:`~biencoder.engine.modeling.loss`)."""
