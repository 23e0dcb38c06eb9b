"""Errors about the user's input. Each message is one line naming the key, file or user at fault;
workflow scripts print it as is, without a traceback."""


class UphError(ValueError):
    """Base class: bad input the user can fix."""


class ConfigError(UphError):
    """A config value is wrong; the message names the key."""


class CorpusError(UphError):
    """The corpus cannot be used as given; the message names the file, column or user."""


class ModelError(UphError):
    """The model source cannot be loaded; the message names it."""


class ArtifactError(UphError):
    """A file a job wrote for later jobs is missing, damaged or was built for something else; the
    message names it and the command that rebuilds it (uph.artifacts)."""


class CacheError(ArtifactError):
    """A hidden-state cache file is missing, damaged or was built for something else."""


class FitDivergedError(UphError):
    """A theta fit produced a NaN or inf; the message names the user and the configuration."""


class TrainingDivergedError(UphError):
    """A training run (copy task, feedback) reached a NaN or inf loss; the message names the run,
    the step and the config key to lower."""
