"""Config files: strict pydantic models read from YAML, their paths resolved against the file's folder.

Every config (the training recipe `orchard.train.config`, an eval or a collection
`orchard.eval.config`) is made of `ConfigModel`s: an unknown key is a mistake, and every field has
a `description`, its one documentation (a field without one fails at import). `load_config_file`
reads a file and reports every mistake at once, unknown keys first, each at its location:
`rl.group_sise: unknown key (did you mean group_size?); rl.max_steps: Input should be a valid integer`.

Fields that name files are typed by what they name, and resolved when validated, against the
config file's folder (the working folder for a config built in code), after `~` and `$VARIABLE`s
are expanded. `$ORCHARD_HOME` and `$ORCHARD_CACHE_DIR` are Orchard's settings, set or not:

* `LocalPath`: a file or folder; `Folder`: a folder that exists;
* `Source`: a local path where one exists, else as written (a hub id such as `owner/name`);
* `ModelSpec`, `HarnessSpec`: `hf:PATH`, `scripted:FILE` and `FILE.py:Class` name files like a `Source`.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo

from orchard.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
_VARIABLE = re.compile(r"\$(?:(\w+)|\{(\w+)\})")


class ConfigModel(BaseModel):
    """A config or a section of one: unknown keys are refused; every field says what it is."""

    model_config = ConfigDict(extra="forbid")
    renamed: ClassVar[dict[str, str]] = {}
    """Keys of older configs and their new names, named in the error that refuses them."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        undocumented = [name for name, field in cls.model_fields.items() if not field.description]
        if undocumented:
            raise TypeError(f"{cls.__name__}: give {', '.join(undocumented)} a description")


def expand(value: str) -> str:
    """`value` with `$VARIABLE`s and a leading `~` expanded; an unset variable is a mistake."""
    from orchard.config import settings

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name == "ORCHARD_HOME":
            return str(settings().home)
        if name == "ORCHARD_CACHE_DIR":
            return str(settings().cache_dir)
        if name not in os.environ:
            raise ValueError(f"${name} is not set")
        return os.environ[name]

    return os.path.expanduser(_VARIABLE.sub(lookup, value))


def _base(info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base")
    return Path(base) if base is not None else Path.cwd()


def local_path(value: str, info: ValidationInfo) -> str:
    """A `LocalPath`'s validation, for types that hold a path or a word (`predictions: gold`)."""
    return os.path.abspath(_base(info) / expand(value))


def _folder(value: str, info: ValidationInfo) -> str:
    path = local_path(value, info)
    if not Path(path).is_dir():
        raise ValueError(f"{path} is not a folder")
    return path


def _source(value: str, info: ValidationInfo) -> str:
    expanded = expand(value)
    local = _base(info) / expanded
    hub_id = expanded.count("/") == 1 and not expanded.startswith((".", "/"))
    from orchard.tasks.loading import SCHEMES

    scheme, colon, _ = expanded.partition(":")
    found = _exists(local)
    if colon and scheme in SCHEMES and not found:  # `miniwob:click-button`: a set a package ships
        return expanded
    return os.path.abspath(local) if found or not hub_id else expanded


def _exists(path: Path) -> bool:
    """Whether `path` exists; False for what cannot be a path here (a name too long: a list of ids)."""
    try:
        return path.exists()
    except OSError:
        return False


def _model_spec(value: str, info: ValidationInfo) -> str:
    kind, colon, rest = value.partition(":")
    if kind in ("hf", "scripted") and colon and rest not in ("gold", "regress"):
        local = _base(info) / expand(rest)
        if local.exists():
            return f"{kind}:{os.path.abspath(local)}"
    return value


def _harness_spec(value: str, info: ValidationInfo) -> str:
    where, colon, attribute = value.rpartition(":")
    if colon and where.endswith(".py") and (_base(info) / expand(where)).is_file():
        return f"{os.path.abspath(_base(info) / expand(where))}:{attribute}"
    return value


LocalPath = Annotated[str, AfterValidator(local_path)]
Folder = Annotated[str, AfterValidator(_folder)]
Source = Annotated[str, AfterValidator(_source)]
ModelSpec = Annotated[str, AfterValidator(_model_spec)]
HarnessSpec = Annotated[str, AfterValidator(_harness_spec)]


def load_config_file(path: str | Path, model: type[M]) -> M:
    """The config in YAML file `path`, its relative paths taken from the file's folder."""
    import yaml

    source = Path(path).expanduser()
    if not source.is_file():
        raise ConfigError(f"no config file {path}")
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config is a mapping of keys, see {model.__module__}.{model.__name__}")
    return validated(model, data, base=source.resolve().parent, where=str(path))


def validated(
    model: type[M],
    data: Any,
    *,
    base: str | Path | None = None,
    where: str = "config",
    flags: dict[str, str] | None = None,
) -> M:
    """`data` as a `model`, relative paths taken from `base` (default: the working folder); every
    mistake in one `ConfigError`. With `flags` (key -> flag), the data came from a command line:
    mistakes name the flags, and `where` is left out."""
    try:
        return model.model_validate(data, context={"base": base})
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")  # stable: unknown keys first
        if flags is not None:
            for error in errors:
                loc = tuple(error["loc"])
                if loc and str(loc[0]) in flags:
                    error["loc"] = (flags[str(loc[0])], *loc[1:])
        mistakes = "; ".join(_mistake(model, e) for e in errors)
        raise ConfigError(mistakes if flags is not None else f"{where}: {mistakes}") from None


def _mistake(model: type[BaseModel], error: Any) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc)
    if not where:  # a check of the whole config
        return error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key{_hint(_model_at(model, loc[:-1]), str(loc[-1]))}"
    if error["type"] == "missing":
        return f"{where}: missing (a required key)"
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"


def _hint(model: type[BaseModel] | None, key: str) -> str:
    if model is None:
        return ""
    if issubclass(model, ConfigModel) and key in model.renamed:
        return f" (renamed {model.renamed[key]})"
    known = list(model.model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]}?)" if close else f" (known keys: {', '.join(known)})"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model at `loc` (list indices skipped), if one is there."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        inner = [t for t in (field.annotation, *get_args(field.annotation)) if inspect.isclass(t)]
        sections = [t for t in inner if issubclass(t, BaseModel)]
        if not sections:
            return None
        model = sections[0]
    return model
