"""Machine: GPUs, host links, GPU<->GPU links, the CPU, and the cost model (docs/design.md).

Named presets reproduce the papers' servers; each carries a one-line source.  Select one as
``NAME`` or ``NAME:key=value,...`` (e.g. ``disco-example:gpu_memory=64MiB``,
``a100x8:host_memory=512GB``) with :func:`machine_from_spec`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .budget import MACHINE_GPU, STREAM_SLOT, check_ram
from .checks import INF, dumps, number, short
from .devices import CPU, gpu_index, gpu_name, is_gpu
from .errors import GraphError, SpecError
from .formats.nodelink import check_input
from .kernel_model import (
    KernelFit,
    by_class,
    fit_problem,
    kernel_time,
    op_class,
)
from .ops import OPS, op_name, touched_bytes
from .registry import Registry
from .spec import apply_options, parse_bytes, parse_spec

if TYPE_CHECKING:
    from .taskgraph import Task, TaskGraph

MiB = 2**20
GiB = 2**30

UNLIMITED = frozenset({"gpu_flops", "gpu_half_flops", "gpu_mem_bandwidth", "h2d_bandwidth",
                       "d2h_bandwidth", "host_bus_bandwidth", "gpu_gpu_bandwidth", "cpu_flops"})
"""Rates that may be infinite ("unlimited": the cost model then charges no time for them);
JSON has no infinity, so they are written as ``null``."""

HALF_DTYPES = frozenset({"float16"})
"""The dtypes whose kernels run at ``gpu_half_flops`` (the tensor cores' half-precision rate)."""

ENGINES = ("sharing", "fifo")
"""How a GPU's compute engine runs the kernels launched on its streams: ``sharing`` (they run
at once, sharing its throughput equally: processor sharing) or ``fifo`` (one at a time, in
launch order: the numpy backend, whose GPU is one core)."""

COSTS = ("roofline", "fitted")
"""How GPU kernels are priced (:meth:`Machine.duration`): ``roofline`` (peak rates) or
``fitted`` (:mod:`.kernel_model`, from the machine's ``kernel_fit``)."""

NOT_OPTIONS = ("name", "source", "op_rates", "kernel_fit")
"""The fields a ``NAME:field=value`` spec cannot override (a machine file can give them)."""

MAY_BE_ZERO = frozenset({"host_bus_bandwidth", "gpus_per_bus", "gpu_half_flops"})
"""Fields where 0 is allowed and means "none" or "as the related field" (see :class:`Machine`)."""

UNLIMITED_WORDS = ("unlimited", "none", "inf")
"""How a spec override says that ``host_memory`` is unlimited (``a100x8:host_memory=unlimited``)."""


@dataclass(frozen=True)
class Machine:
    """A homogeneous multi-GPU server and its cost model.

    Bandwidths are bytes/s, rates flop/s, latencies seconds.  ``gpu_flops`` is the fp32 rate;
    ``gpu_half_flops`` the rate of kernels writing a half-precision tensor (:data:`HALF_DTYPES`;
    the datasheet's dense tensor-core figure, fp32 accumulate where it gives one; 0 = the fp32
    rate).  ``duplex`` is the factor by which each direction of a GPU's host link slows while
    the other direction is busy (1.0 = ideal full duplex).  ``engine`` is how a GPU runs the
    kernels launched on its ``streams`` (:data:`ENGINES`): ``sharing`` or ``fifo``.

    Host buses: ``host_bus_bandwidth`` > 0 puts the GPUs' host links behind shared buses, one
    per direction per group of ``gpus_per_bus`` consecutive GPUs (the uplink of a PCIe switch
    to the CPU; 0 = one bus for all GPUs, resources ``bus:h2d``/``bus:d2h``; otherwise GPU ``i``
    is behind ``bus{i // gpus_per_bus}:h2d``/``...:d2h``).  A bus carries one copy at a time,
    taken after the GPU's link; ``host_bus_bandwidth`` = 0 means no bus.  ``op_rates`` holds
    measured ``(op, written, read, overhead)`` entries (``offloadlab calibrate``): bytes/s
    written and read, and seconds each kernel takes beyond a tiny one (a file's three-element
    entry has none).  A GPU kernel of such an op takes ``kernel_latency + overhead + max(flops
    / rate, out_bytes / written + in_bytes / read)``, with no flops for a folding op's.

    ``cost`` prices the other GPU kernels (:data:`COSTS`): ``roofline`` at the peak rates, or
    ``fitted`` by the kernel-time model of :mod:`.kernel_model` with the parameters
    ``kernel_fit`` (docs/cost-model.md); a roofline machine has no ``kernel_fit`` and is
    written without either field, as before the fitted model.
    """

    name: str = "custom"
    source: str = ""
    gpus: int = 1
    gpu_memory: int = 16 * GiB
    gpu_flops: float = 14e12
    gpu_half_flops: float = 0.0
    gpu_mem_bandwidth: float = 900e9
    kernel_latency: float = 5e-6
    streams: int = 5
    engine: str = "sharing"
    h2d_bandwidth: float = 12e9
    d2h_bandwidth: float = 12e9
    duplex: float = 1.0
    link_latency: float = 10e-6
    host_bus_bandwidth: float = 0.0
    gpus_per_bus: int = 0
    gpu_gpu_bandwidth: float = 25e9
    gpu_gpu_latency: float = 10e-6
    cpu_flops: float = 0.5e12
    host_memory: int | None = None
    op_rates: tuple[tuple[str, float, float, float], ...] = ()
    cost: str = "roofline"
    kernel_fit: KernelFit = ()

    def __post_init__(self):
        _check_fields({f.name: getattr(self, f.name) for f in fields(self)},
                      f"machine {self.name!r}")
        if any(len(e) == 3 for e in self.op_rates):     # an entry without its overhead
            object.__setattr__(self, "op_rates", tuple((*e, 0.0)[:4] for e in self.op_rates))

    @cached_property
    def _fit(self) -> dict[str, tuple[float, float, float, float]]:
        """``kernel_fit`` by class, made once (the cost model asks for it per kernel)."""
        return by_class(self.kernel_fit)

    # -- topology ---------------------------------------------------------------------
    def gpu_names(self) -> list[str]:
        """The machine's GPUs by name.

        Returns
        -------
        list of str
            ``gpu0`` to ``gpu{gpus - 1}``.
        """
        return [gpu_name(i) for i in range(self.gpus)]

    def check_devices(self, devices) -> None:
        """Raise SpecError if a graph uses a GPU this machine lacks.

        Parameters
        ----------
        devices : iterable of str
            The devices a graph uses.

        Raises
        ------
        SpecError
            Naming the first GPU the machine lacks.
        """
        names = set(self.gpu_names())
        for d in devices:
            if is_gpu(d) and d not in names:
                raise SpecError(f"machine {self.name!r} has {self.gpus} GPU(s) "
                                f"({', '.join(sorted(names))}); the graph uses {d}")

    # -- cost model -------------------------------------------------------------------
    def resources(self, kind: str, device: str) -> tuple[str, ...]:
        """The resources a vertex holds while it runs: first the engine, then shared buses.

        Parameters
        ----------
        kind : str
            The vertex's kind (``compute``, ``load``, ``offload``, ...).
        device : str
            Where it runs: its GPU, ``cpu``, or the GPU a copy goes to or from.

        Returns
        -------
        tuple of str
            Resource names such as ``gpu0``, ``h2d:gpu0``, ``bus:h2d``; empty for inputs.
        """
        if kind == "compute":
            return (CPU,) if device == CPU else (device,)
        if kind == "transfer":
            return (device,)
        if kind in ("load", "reload"):
            return (f"h2d:{device}",) + self._bus(device, "h2d")
        if kind == "offload":
            return (f"d2h:{device}",) + self._bus(device, "d2h")
        return ()

    def _bus(self, gpu: str, direction: str) -> tuple[str, ...]:
        """The host bus ``gpu``'s copies in ``direction`` take after its link, if any."""
        if not self.host_bus_bandwidth:
            return ()
        if not self.gpus_per_bus or self.gpus_per_bus >= self.gpus:
            return (f"bus:{direction}",)
        return (f"bus{gpu_index(gpu) // self.gpus_per_bus}:{direction}",)

    def duration(self, kind: str, device: str, nbytes: int, flops: float = 0.0,
                 touched: int = 0, time: float | None = None, op: str | None = None,
                 dtype: str = "float32") -> float:
        """Seconds a vertex takes alone on its resources.

        A profiled ``time`` wins.  GPU kernels follow a roofline: ``latency + max(flops /
        rate, touched / mem_bw)`` with ``touched`` the bytes read and written and ``rate`` the
        half-precision one if the kernel writes a ``dtype`` of :data:`HALF_DTYPES`; an op in
        ``op_rates`` takes ``latency + overhead + max(flops / rate, nbytes / written + (touched
        - nbytes) / read)``, at its measured rates; or with ``cost=fitted`` the fitted model
        of the op's class at those rates (:func:`~.kernel_model.kernel_time`); copies take
        ``latency + bytes / bandwidth``.

        Parameters
        ----------
        kind : str
            The vertex's kind.
        device : str
            Where it runs (see :meth:`resources`).
        nbytes : int
            The bytes it writes or copies.
        flops : float
            Its floating-point operations.
        touched : int
            The bytes a kernel reads and writes.
        time : float, optional
            A profiled time, in seconds.
        op : str, optional
            The kernel's op.
        dtype : str
            The dtype the kernel writes.

        Returns
        -------
        float
            Seconds.
        """
        if time is not None:
            return time
        if kind == "compute":
            if device == CPU:
                return flops / self.cpu_flops
            rate = (self.gpu_half_flops or self.gpu_flops) if dtype in HALF_DTYPES \
                else self.gpu_flops
            if self.op_rates and op is not None:
                base = op_name(op)              # the rates are by op, not its parameters
                for name, written, read, overhead in self.op_rates:
                    if name == base:    # a folding op's flops are its vertex's, not its work
                        work = 0.0 if base in OPS and OPS[base].folds else flops / rate
                        return self.kernel_latency + overhead + max(
                            work, nbytes / written + (touched - nbytes) / read)
            if self.cost == "fitted":
                return kernel_time(self._fit[op_class(op)], flops, touched, rate,
                                   self.gpu_mem_bandwidth)
            return self.kernel_latency + max(flops / rate, touched / self.gpu_mem_bandwidth)
        cost = self.copy_cost(kind)                 # latency + bytes / bandwidth
        return 0.0 if cost is None else cost[0] + nbytes / cost[1]

    def copy_cost(self, kind: str) -> tuple[float, float] | None:
        """The latency (s) and bandwidth (bytes/s) of a copy of ``kind``; None for no copy.

        Parameters
        ----------
        kind : str
            The vertex's kind.

        Returns
        -------
        tuple of (float, float) or None
        """
        if kind == "transfer":
            return float(self.gpu_gpu_latency), float(self.gpu_gpu_bandwidth)
        if kind in ("load", "reload", "offload"):
            return float(self.link_latency), float(self.host_rate(
                "d2h" if kind == "offload" else "h2d"))
        return None

    def task_seconds(self, graph: TaskGraph, t: Task) -> float:
        """Seconds TaskGraph vertex ``t`` of ``graph`` takes alone.

        :meth:`duration`, with the bytes its op touches.

        Parameters
        ----------
        graph : TaskGraph
            The graph holding ``t``.
        t : Task
            The vertex.

        Returns
        -------
        float
            Seconds.
        """
        touched = touched_bytes(t.op, t.bytes, [graph[u].bytes for u in t.inputs])
        return self.duration(t.kind, t.device, t.bytes, t.flops, touched, t.time, t.op,
                             t.dtype)

    def host_rate(self, direction: str) -> float:
        """Bytes/s of one host copy alone: its link's bandwidth, capped by the host bus's if any.

        Parameters
        ----------
        direction : str
            ``"h2d"`` or ``"d2h"``.

        Returns
        -------
        float
            Bytes per second.
        """
        link = self.h2d_bandwidth if direction == "h2d" else self.d2h_bandwidth
        return min(link, self.host_bus_bandwidth) if self.host_bus_bandwidth else link

    def options(self) -> dict[str, object]:
        """The fields a spec may override (``NAME:field=value``), with this machine's values.

        Returns
        -------
        dict of str to object
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_OPTIONS}

    # -- interchange ------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The fields as JSON values.

        An unlimited (infinite) rate is ``None`` (JSON ``null``), which :meth:`from_dict` reads
        back as unlimited.  An unlimited ``host_memory`` is left out, so that a machine without
        host memory records what it did before the field.

        Returns
        -------
        dict
        """
        data = asdict(self)
        for key in UNLIMITED:
            if data[key] == INF:
                data[key] = None
        if self.cost == "roofline":
            del data["cost"], data["kernel_fit"]
        if data["host_memory"] is None:
            del data["host_memory"]
        return data

    @classmethod
    def from_dict(cls, data: dict, where: str = "machine description") -> Machine:
        """A Machine from :meth:`to_dict`'s output, every field checked.

        ``None`` (``null``) is an unlimited rate, an integral float an integer field.

        Parameters
        ----------
        data : dict
            The fields.
        where : str
            What the data is, for error messages.

        Returns
        -------
        Machine

        Raises
        ------
        SpecError
            Naming ``where`` and the field: not an object, an unknown field or a bad value.
        """
        if type(data) is not dict:
            raise SpecError(f"{where}: expected a JSON object of Machine fields, got "
                            f"{short(data)}")
        types = {f.name: f.type for f in fields(cls)}
        # cpu_cores, never used, was dropped: files that still carry it load as before
        data = {k: v for k, v in data.items() if k != "cpu_cores"}
        unknown = sorted(set(data) - set(types))
        if unknown:
            raise SpecError(f"{where}: unknown field(s): {', '.join(map(str, unknown))}")
        data = dict(data)
        for key, value in data.items():
            if value is None and key in UNLIMITED:
                data[key] = INF
            elif types[key] in ("int", "int | None") and type(value) is float \
                    and value.is_integer():
                data[key] = int(value)
        if "op_rates" in data:
            rates = data["op_rates"]
            if type(rates) not in (list, tuple) \
                    or not all(type(e) in (list, tuple) and len(e) in (3, 4) for e in rates):
                raise SpecError(f"{where}: op_rates must be a list of [op, bytes/s written, "
                                f"bytes/s read, seconds of overhead], got {short(rates)}")
            data["op_rates"] = tuple(tuple(e) for e in rates)
        if type(data.get("kernel_fit")) is list:
            data["kernel_fit"] = tuple(tuple(e) if type(e) is list else e
                                       for e in data["kernel_fit"])
        _check_fields(data, where)
        machine = cls(**data)
        check_machine_ram(machine, where)
        return machine

    def to_json(self) -> str:
        """Strict JSON (unlimited rates as ``null``).

        Returns
        -------
        str
        """
        return dumps(self.to_dict(), f"machine {self.name!r}")

    @classmethod
    def from_json_file(cls, path: str | Path) -> Machine:
        """Read a Machine JSON file (``to_json``'s output), naming the file in any error.

        Parameters
        ----------
        path : str or Path
            The file.

        Returns
        -------
        Machine

        Raises
        ------
        SpecError
            The file cannot be read, is not JSON, or is not a Machine.
        """
        where = f"machine file {str(path)!r}"
        try:
            check_input(path, "machine")
        except GraphError as exc:
            raise SpecError(str(exc)) from None
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(f"cannot read {where}: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise SpecError(f"{where}: not a JSON Machine ({exc})") from None
        machine = cls.from_dict(data, where)         # every field given checked first
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise SpecError(f"{where}: no {' and no '.join(missing)}; a machine file must "
                            f"state {' and '.join(REQUIRED)} (a preset or NAME:field=value "
                            f"gives the others)")
        return machine


REQUIRED = ("gpus", "gpu_memory")
"""The fields a machine file must state: no default could stand for them."""


def check_machine_ram(machine: Machine, where: str) -> None:
    """Refuse a machine whose GPUs and stream slots would not fit in the RAM available.

    The RAM to plan and run on it (:mod:`.budget`).

    Parameters
    ----------
    machine : Machine
        The machine.
    where : str
        What names it in the error.

    Raises
    ------
    SpecError
        Its GPUs and stream slots need more RAM than is available.
    """
    check_ram(f"{where} ({machine.gpus} GPUs, {machine.streams} streams each)",
              machine.gpus * (MACHINE_GPU + machine.streams * STREAM_SLOT))


_FIELD_TYPES = {f.name: f.type for f in fields(Machine)}


def _check_fields(values: dict, where: str) -> None:
    """Check Machine field ``values`` (all or some), naming ``where`` and the field: strings,
    positive integers, numbers >= 0 (> 0 for rates; 0 allowed for :data:`MAY_BE_ZERO`;
    infinite only for :data:`UNLIMITED`), ``host_memory`` a positive integer or None,
    ``engine`` one of :data:`ENGINES`, ``duplex`` in (0, 1], ``op_rates`` as
    ``(op, written, read[, overhead])`` with finite positive rates and a finite overhead >= 0,
    ``cost`` one of :data:`COSTS` with a valid ``kernel_fit`` if ``fitted`` and none if not."""
    for key, value in values.items():
        kind = _FIELD_TYPES[key]
        if key == "host_memory":
            if value is not None:
                number(value, where, key, count=True, positive=True, error=SpecError)
        elif kind == "str":
            if type(value) is not str:
                raise SpecError(f"{where}: {key} must be a string, got {short(value)}")
        elif kind == "int":
            number(value, where, key, count=True, positive=key not in MAY_BE_ZERO,
                   error=SpecError)
        elif kind == "float":
            zero_ok = key.endswith("latency") or key in MAY_BE_ZERO
            number(value, where, key, positive=not zero_ok, unlimited=key in UNLIMITED,
                   error=SpecError)
    if "engine" in values and values["engine"] not in ENGINES:
        raise SpecError(f"{where}: engine must be one of {', '.join(ENGINES)}, got "
                        f"{short(values['engine'])}")
    if "duplex" in values and not 0 < values["duplex"] <= 1:
        raise SpecError(f"{where}: duplex must be in (0, 1], got {values['duplex']}")
    _check_cost(values, where)
    rates = values.get("op_rates", ())
    if type(rates) is not tuple:
        raise SpecError(f"{where}: op_rates must be a list, got {short(rates)}")
    for entry in rates:
        if type(entry) is not tuple or len(entry) not in (3, 4) or type(entry[0]) is not str \
                or not all(type(r) in (int, float) and 0 < r < INF for r in entry[1:3]) \
                or not all(type(r) in (int, float) and 0 <= r < INF for r in entry[3:]):
            raise SpecError(f"{where}: op_rates entries must be [op, bytes/s written, "
                            f"bytes/s read, seconds of overhead], the rates positive, the "
                            f"overhead >= 0, all finite; got {short(entry)}")


def _check_cost(values: dict, where: str) -> None:
    """``cost`` one of :data:`COSTS`; ``kernel_fit`` valid and given exactly when ``cost`` is
    ``fitted`` (either missing: the default, ``roofline`` and no fit)."""
    if "cost" not in values and "kernel_fit" not in values:
        return
    cost, fit = values.get("cost", "roofline"), values.get("kernel_fit", ())
    if cost not in COSTS:
        raise SpecError(f"{where}: cost must be one of {', '.join(COSTS)}, got {short(cost)}")
    if cost == "roofline":
        if fit != ():
            raise SpecError(f"{where}: kernel_fit is given but cost is roofline; give "
                            f"cost=fitted or leave kernel_fit out")
        return
    if fit == ():
        fitted = ", ".join(name for name, m in PRESETS.items() if m.kernel_fit)
        raise SpecError(f"{where}: cost=fitted needs the fitted kernel parameters "
                        f"(kernel_fit), which this machine has not; presets with them: "
                        f"{fitted}")
    problem = fit_problem(fit)
    if problem:
        raise SpecError(f"{where}: kernel_fit {problem}")


PRESETS: Registry[Machine] = Registry("machine preset", doc=lambda m: m.source,
                                     options=lambda m: m.options())
"""The machine presets by name, each with a ``source`` for its figures (filled by
:mod:`.presets`, which the package imports)."""
def machine_from_spec(spec: str | Machine) -> Machine:
    """``"v100:h2d_bandwidth=4e9"`` -> the v100 preset with that override.

    The name may also be the path of a Machine JSON file (such as ``offloadlab calibrate``
    writes), with the same ``:field=value`` overrides.  ``cost=roofline`` drops a fitted
    machine's ``kernel_fit``.

    Parameters
    ----------
    spec : str or Machine
        ``NAME[:field=value,...]``; a Machine is returned as it is.

    Returns
    -------
    Machine

    Raises
    ------
    SpecError
        An unknown preset (and no such file), field or value.
    """
    if isinstance(spec, Machine):
        return spec
    name, options = parse_spec(spec)
    if name.endswith(".json") or "/" in name or Path(name).is_file():
        base = Machine.from_json_file(name)
    elif name not in PRESETS:
        raise PRESETS.unknown(name, "(nor a Machine JSON file)")
    else:
        base = PRESETS[name]
    defaults = base.options()
    options = dict(options)
    host = options.pop("host_memory", None)      # bytes or unlimited: read by its own rule
    merged = apply_options(defaults, options, f"machine {name!r}", unlimited=UNLIMITED)
    if merged["cost"] == "roofline":
        merged["kernel_fit"] = ()       # a roofline machine carries no fit
    if host is not None:
        merged["host_memory"] = host_memory_option(host, f"machine {name!r} option host_memory")
    machine = replace(base, **merged)  # type: ignore[arg-type]  # apply_options checked each
    check_machine_ram(machine, f"machine {spec!r}")
    return machine


def host_memory_option(text: str, where: str) -> int | None:
    """A ``host_memory=`` override.

    Parameters
    ----------
    text : str
        A byte size (``512GB``, ``1.5TiB``, ``4096``) or one of :data:`UNLIMITED_WORDS`.
    where : str
        What names the value in the error.

    Returns
    -------
    int or None
        Bytes, or None for unlimited.

    Raises
    ------
    SpecError
        ``text`` is neither, naming ``where``.
    """
    if text.strip().lower() in UNLIMITED_WORDS:
        return None
    try:
        return parse_bytes(text)
    except SpecError:
        raise SpecError(f"{where}: cannot read {text!r} as a byte size (e.g. 512GB) or "
                        f"unlimited") from None
