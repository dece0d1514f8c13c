"""What the commands check in their flags past parsing, before anything long starts, and the one
line a mistake ends as: :func:`fail` for a mistake found here, :func:`usage_error` for one the
parser found. A check that passes returns the flag's value as the library takes it.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer

from compass.config import TLSConfig
from compass.errors import ConfigError

from .options import BatchGain, Batching


def one_line(message: str) -> str:
    return " ".join(message.split())


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command: ``compass: MESSAGE`` on stderr, exit ``code`` (2: a usage mistake)."""
    typer.echo(f"compass: {one_line(message)}", err=True)
    raise typer.Exit(code)


def usage_error(exc: typer.TyperException, argv: Sequence[str]) -> str:
    """One line: what is wrong, and the value given where the message lacks it."""
    message = one_line(exc.format_message())
    given = _given_value(getattr(exc, "param", None), argv)
    if given is not None and f"'{given}'" not in message:
        message = f"{message} (got {given!r})"
    return message


def _given_value(param: Any, argv: Sequence[str]) -> str | None:
    """The value the user gave ``param``: from the command line, else from its variable."""
    opts = getattr(param, "opts", None) or []
    for index, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in opts:
            if eq:
                return value
            return argv[index + 1] if index + 1 < len(argv) else None
    envvar = getattr(param, "envvar", None)
    return os.environ.get(envvar) if isinstance(envvar, str) else None


def tls_config(cert: str | None, key: str | None, ca: str | None) -> TLSConfig | None:
    """The three --tls-* flags as one TLSConfig: all or none."""
    given = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
    if not any(given.values()):
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing or cert is None or key is None or ca is None:
        raise ConfigError(
            f"mutual TLS needs --tls-cert, --tls-key and --tls-ca together; missing "
            f"{', '.join(missing)}"
        )
    return TLSConfig(cert=cert, key=key, ca=ca)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_workload() -> str:
    from compass._bench.e2e import DEFAULT_WORKLOAD

    return str(DEFAULT_WORKLOAD)


def check_workload(path: str) -> None:
    """Read ``path`` as a workload now, so a bad file fails before anything starts."""
    from compass.workflow.spec import load_workload

    load_workload(path)


def check_policies(names: Sequence[str]) -> None:
    from compass.sched import POLICY_NAMES

    if not names:
        raise ConfigError("no policy given")
    for name in names:
        if name not in POLICY_NAMES:
            raise ConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")


def check_output(path: str | None, flag: str) -> None:
    """Fail now, not after a long run, if ``path`` cannot be written."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        fail(f"{flag} {path}: is a folder, expected a file path", 2)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{flag} {path}: cannot create its folder: {exc.strerror}", 2)
    if not os.access(target.parent, os.W_OK):
        fail(f"{flag} {path}: folder {str(target.parent)!r} is not writable", 2)


def check_plot(path: str | None, flag: str = "--plot") -> None:
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail(f"{flag} {path}: needs matplotlib: pip install 'compass[bench]'", 2)
    check_output(path, flag)


def comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [name.strip() for name in text.split(",") if name.strip()]


def sweep_range(text: str | None) -> tuple[int, int] | None:
    """``--servers-sweep LO..HI`` as ``(LO, HI)``; None when not given."""
    if not text:
        return None
    lo, sep, hi = text.partition("..")
    try:
        low, high = int(lo), int(hi)
    except ValueError:
        low = high = 0
    if not sep or not 1 <= low <= high:
        fail(f"--servers-sweep {text!r}: expected LO..HI with 1 <= LO <= HI", 2)
    return low, high


def capacity_args(seeds: str, slo: list[str] | None, max_load: float) -> tuple[Any, Any]:
    """``--seeds``, ``--slo`` and ``--max-load`` checked: (seeds, SLOs: built-ins first)."""
    from compass.sim.capacity import BUILTIN_SLOS, parse_seeds, parse_slo

    if not 0 < max_load < float("inf"):
        fail(f"--max-load {max_load}: must be a finite number > 0", 2)
    slos = list(BUILTIN_SLOS)
    for text in (t for value in slo or [] for t in comma_list(value)):
        extra = parse_slo(text)
        if extra.name not in {s.name for s in slos}:
            slos.append(extra)
    return parse_seeds(seeds), slos


def batching_keywords(batching: Batching, gain: BatchGain | None) -> dict[str, Any]:
    """The two batching flags as the keywords the runners take."""
    return {"batching": batching == Batching.on, "batch_gain": None if gain is None else gain.value}


def time_scale_for(given: float | None, spec: str) -> float:
    """``--time-scale``, or the one the workload needs (:func:`e2e.auto_time_scale`)."""
    if given is not None:
        return given
    from compass._bench import e2e
    from compass.workflow.spec import load_workload

    scale = e2e.auto_time_scale(load_workload(spec))
    if scale != e2e.DEFAULT_TIME_SCALE:
        print(f"time scale {scale:g}: the workload's shortest workflow needs it (--time-scale)")
    return float(scale)
