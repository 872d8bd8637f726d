"""tinygrad on uopd: ``DEV=UOPD`` runs an unmodified tinygrad program's kernels on uopd.

    DEV=UOPD UOPD_ADDRESS=host:port python3 -m uopd.tinygrad prog.py [args...]

or, in the program (or a ``.pth`` file of site-packages holding the line ``import uopd.tinygrad``),
``import uopd.tinygrad`` before tinygrad opens its device. Importing this package only
registers the device: tinygrad opens a device NAME by importing
``tinygrad.runtime.ops_<name>`` and taking its ``<Name>Device`` class (tinygrad/device.py),
so a meta path finder answers ``tinygrad.runtime.ops_uopd`` with uopd.tinygrad.device; tinygrad
itself (which this package does not import until the device opens) is not modified.
Device names: ``UOPD`` is uopd's CPU:0, ``UOPD:n`` its CPU:n.

Where tinygrad's graph is handed over: each scheduled kernel's AST, the SINK tinygrad gives
a Compiled device to lower, before any of its optimizer runs (uopd.tinygrad.device). Not
the tensor graph: tinygrad's scheduler owns what the rest of tinygrad relies on (buffer
identity and lifetimes, assign, the JIT's captured kernels, copies between devices, its
own kernel boundaries), and at kernel level every tinygrad program's ops meet uopd's IR
almost one for one (uopd.tinygrad.translate), with one uopd graph per kernel, which uopd's
cache then keys by its structural digest. Not later either: from that SINK on, tinygrad's
codegen optimizes (opts, BEAM, upcasts) and lowers for its renderer; uopd does both itself.
Only what tinygrad's lowering does before it optimizes is done here (in-kernel UNSHARDs,
movement ops folded into indices, its algebraic simplification): rewrites of the kernel's
math, on which its numerics rely, not choices of its schedule.

Multi-device: ``Tensor.shard`` over ``UOPD``, ``UOPD:1``, ... runs each shard's kernels on its
uopd device, and tinygrad's ALLREDUCE (a sum over the shard axis: a data-parallel step's
gradients) is handed over at the tensor level instead: one uopd Run of uopd's MULTI /
ALLREDUCE over the partials' session buffers, a collective between uopd's workers
(uopd.tinygrad.collectives). tinygrad's scheduler makes the ALLREDUCE before it cuts
kernels, so this is the one place the handover is above kernel level.

Tested with the tinygrad snapshot at commit a9069c17 (2026-08-22).
"""
import importlib.abc
import importlib.machinery
import importlib.util
import sys

DEVICE_MODULE = "tinygrad.runtime.ops_uopd"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from uopd.tinygrad import device
        for name in device.__all__:
            setattr(module, name, getattr(device, name))
        module.__doc__ = device.__doc__


class _Finder(importlib.abc.MetaPathFinder):
    """Finds tinygrad.runtime.ops_uopd: uopd.tinygrad.device's classes under tinygrad's name."""

    def find_spec(self, fullname, path, target=None):
        if fullname != DEVICE_MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin="uopd.tinygrad.device")


def _hook_schedule() -> None:
    """uopd.tinygrad.device's hooks into tinygrad (its lowering, memory planner and
    allreduce), made by importing it: tinygrad schedules (memory plan and allreduces
    included) before it opens the devices that run the schedule."""
    from uopd.tinygrad import device  # noqa: F401


class _AfterTinygrad(importlib.abc.Loader):
    """tinygrad's own loader of the `tinygrad` package, then _hook_schedule."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _hook_schedule()


class _TinygradFinder(importlib.abc.MetaPathFinder):
    """Finds the `tinygrad` package as the path finder does, with _AfterTinygrad as its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tinygrad":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterTinygrad(spec.loader)
        return spec


def install() -> None:
    """Registers the UOPD device with tinygrad (done by importing this package) and hooks its
    scheduler's allreduce, now if tinygrad is imported already, else once it is; idempotent."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    if "tinygrad" in sys.modules:
        _hook_schedule()
    elif not any(isinstance(f, _TinygradFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TinygradFinder())


install()
