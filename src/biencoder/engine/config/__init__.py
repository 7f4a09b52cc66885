"""What a run is asked to do: the typed schema that holds every config key and its one default
(:mod:`~biencoder.engine.config.schema`, including the loss options as structured-config dataclasses), a run's
settings as flat keys and which of them change results (:mod:`~biencoder.engine.config.settings`), the paths the
package ships (:mod:`~biencoder.engine.config.packaged`), and the checks of a composed config, each refusing the first
bad value in one line (:mod:`~biencoder.engine.config.validation`). Needs neither torch nor Hydra: the plot and the
Hydra glue import it."""
