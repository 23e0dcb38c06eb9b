"""Settings given on the command line (`snakemake --config key=value`), read as a config file reads them."""

from __future__ import annotations

import yaml
from snakemake.utils import update_config


def _as_yaml(value):
    """`value` with each text leaf read as YAML: '5.0' -> 5.0, 'null' -> None, 'cpu' -> 'cpu'."""
    if isinstance(value, dict):
        return {key: _as_yaml(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_yaml(item) for item in value]
    if isinstance(value, str):
        try:
            read = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return read if read is None or isinstance(read, (bool, int, float, str)) else value
    return value


def read_command_line(config: dict, given) -> dict:
    """`config` with the nested values of `given` (Snakemake's --config settings, already merged into it)
    read as YAML. Snakemake reads `--config 'fit={radii: [0.5, 5.0]}'` with YAML's base loader, every leaf
    text ('5.0'), while a top-level value is a number where it reads as one; so the refusal "text, not a
    number" would advise what the command line cannot do. A config file's values are left as they are."""
    nested = {key: _as_yaml(value) for key, value in dict(given or {}).items() if isinstance(value, (dict, list))}
    update_config(config, nested)  # Snakemake's own merge of --config into the config files
    return config
