"""Caller objects as flat byte views: host memory as numpy ``uint8`` arrays, device
memory as :class:`DeviceView`. Never copies; :class:`InvalidBlock` naming the fix for
anything that cannot be viewed as one contiguous run of bytes.

Recognised without importing any array library: numpy arrays, the buffer protocol,
``__cuda_array_interface__`` (v3, its ``stream`` kept) and ``__dlpack__``. torch tensors are
recognised by their module (``type(obj).__module__``) and handled with the torch the
caller already imported. Local, thread-safe.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidBlock
from .dtypes import as_dtype
from .hostcopy import memory_at

_U8 = np.dtype(np.uint8)
# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


@dataclass(slots=True, eq=False)
class DeviceView:
    """A contiguous run of device memory: what :func:`view` makes of a CUDA array.

    ``stream`` follows the CUDA Array Interface v3: None (no synchronisation needed),
    1 (the legacy default stream), 2 (the per-thread default stream) or a
    ``cudaStream_t`` handle. ``device`` is None when the interface does not say.
    ``owner`` is the caller's object, kept alive as long as the view. Never changed
    once made (not a frozen dataclass: one is made per device buffer per call, and a
    frozen one's construction costs six times as much).
    """

    ptr: int
    nbytes: int
    device: int | None
    stream: int | None
    readonly: bool
    owner: Any


ByteView = np.ndarray | DeviceView


def view(obj: Any, what: str = "buffer", *, writable: bool = False) -> ByteView:
    """``obj``'s bytes, no copy: a flat C-contiguous ``uint8`` numpy array over host
    memory, or a :class:`DeviceView` of device memory. ``writable=True`` also refuses
    read-only memory (outputs). :class:`InvalidBlock` names the fix otherwise."""
    if isinstance(obj, np.ndarray):
        return _numpy(obj, what, writable)
    if isinstance(obj, DeviceView):
        if writable and obj.readonly:
            raise InvalidBlock(f"{what} is read-only device memory: pass a writable array")
        return obj
    if is_torch_tensor(obj):  # (subclasses from elsewhere too: they take torch's route)
        return _torch(obj, what, writable)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return _cuda_interface(obj, cai, what, writable)
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    if mv is not None:
        return _buffer(mv, what, writable)
    if hasattr(obj, "__dlpack__"):
        return _dlpack(obj, what, writable)
    raise InvalidBlock(f"{what}: a {type(obj).__name__} is not an array: pass a numpy array, a torch tensor, a "
                       "cupy array, or an object with the buffer protocol, __cuda_array_interface__ or __dlpack__")


#: ``ndarray.flags.num`` bits of a writable C-contiguous array (NPY_ARRAY_C_CONTIGUOUS and
#: NPY_ARRAY_WRITEABLE): the per-block hot paths test both with one ``&``.
WRITABLE_C = 0x0001 | 0x0400


def host_array(obj: Any, shape: tuple[int, ...], dtype: np.dtype, *, writable: bool = False) -> np.ndarray | None:
    """``obj`` as a numpy array of ``shape`` and ``dtype`` over its own memory (no copy)
    when it is a CPU torch tensor of that shape and dtype (strided, contiguous, without a
    lazy conjugate or negation bit, and as an output not requiring grad); else None, and
    the caller's general path checks it
    (naming what is wrong). The array keeps ``obj`` alive
    (:func:`~cascade.buffers.hostcopy.memory_at`): about 2 us a tensor, where :func:`view`
    takes torch's own route (3-4 us, and ``.numpy()`` names neither bfloat16 nor fp8)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if (not obj.is_cpu or obj.is_nested or (_TORCH_DTYPES.get(obj.dtype) or _numpy_dtype(obj.dtype)) is not dtype
            or obj.shape != shape or obj.layout is not torch.strided or not obj.is_contiguous() or obj.is_conj()
            or obj.is_neg() or (writable and obj.requires_grad)):
        return None
    try:
        address = obj.data_ptr()
    except RuntimeError:  # (a fake tensor's, in torch versions that refuse it)
        return None
    if not address and obj.nbytes:  # no memory (a fake tensor): the general path says so
        return None
    return np.ndarray(shape, dtype, memory_at(address, obj.nbytes, writable, obj))


def settled(obj: Any, what: str = "buffer") -> ByteView:
    """:func:`view` of ``obj`` for memory whose writes are all complete (e.g. a tier's
    slab, written by synchronised copies): a copy out of it waits for no stream."""
    v = view(obj, what)
    return dataclasses.replace(v, stream=None) if isinstance(v, DeviceView) else v


def check_layout(obj: Any, what: str = "buffer", *, writable: bool = False) -> ByteView | None:
    """Raise what :func:`view` would raise for ``obj``; for a numpy array only check it
    (cheaper: a validation on the hot path) and return None, else return the view."""
    if isinstance(obj, np.ndarray):
        _check_numpy(obj, what, writable)
        return None
    return view(obj, what, writable=writable)


def host_view(obj: Any, what: str = "buffer", *, writable: bool = False) -> np.ndarray:
    """:func:`view` of host memory; device memory is refused with :class:`InvalidBlock`
    (use :func:`cascade.buffers.copy` to move it)."""
    v = view(obj, what, writable=writable)
    if isinstance(v, DeviceView):
        raise InvalidBlock(f"{what} is in device memory but this path needs host memory "
                           "(copy it to the host first, e.g. tensor.cpu())")
    return v


def as_byte_view(obj: Any, what: str = "buffer", *, writable: bool = False) -> memoryview:
    """A flat byte ``memoryview`` of host memory (for hashing, ``os.pwritev``/``preadv``
    and MPI); :class:`InvalidBlock` as :func:`host_view`."""
    return memoryview(host_view(obj, what, writable=writable))


def nbytes(obj: Any, what: str = "buffer") -> int:
    """Bytes of a contiguous buffer (host or device)."""
    if isinstance(obj, np.ndarray | DeviceView):
        return int(obj.nbytes)
    return int(view(obj, what).nbytes)


def shape_and_dtype(obj: Any, what: str = "buffer") -> tuple[tuple[int, ...], np.dtype]:
    """``obj``'s element shape and dtype, read from its attributes or protocols.
    :class:`InvalidBlock` when it has none (or an element type numpy cannot name)."""
    if isinstance(obj, np.ndarray):
        return obj.shape, obj.dtype
    try:
        shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
    except RuntimeError as exc:  # e.g. a nested tensor has no single shape
        raise InvalidBlock(f"{what}: its shape cannot be read ({exc})") from None
    if shape is None or dtype is None:
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError:
            cai = None
        if cai is not None:
            shape, dtype = cai["shape"], cai["typestr"]
        else:
            try:
                mv = memoryview(obj)
                shape, dtype = mv.shape, mv.format
            except TypeError:
                if not hasattr(obj, "__dlpack__"):
                    raise InvalidBlock(f"{what} must be an array with a shape and a dtype, got {type(obj).__name__}") from None
                arr = _from_dlpack_host(obj, what)
                shape, dtype = arr.shape, arr.dtype
    try:
        return tuple(map(int, shape)), _numpy_dtype(dtype)
    except InvalidBlock as exc:
        raise InvalidBlock(f"{what}: {exc}") from None


_TORCH_DTYPES: dict[Any, np.dtype] = {}  # torch dtype -> numpy's, as met


def _numpy_dtype(dtype: Any) -> np.dtype:
    """:func:`as_dtype`, remembered for torch dtypes (naming one by its string costs a
    microsecond per buffer)."""
    if type(dtype).__module__ != "torch":
        return as_dtype(dtype)
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = as_dtype(dtype)
    return found


# -- one function per kind of object ------------------------------------------------------
def _numpy(arr: np.ndarray, what: str, writable: bool) -> np.ndarray:
    if _check_numpy(arr, what, writable):
        return arr
    return arr.reshape(-1).view(np.uint8)


def _check_numpy(arr: np.ndarray, what: str, writable: bool) -> bool:
    """Raise unless ``arr`` is usable; True when it is already a flat byte array."""
    flags = arr.flags
    if not flags.c_contiguous:
        raise InvalidBlock(f"{what} is not C-contiguous: pass numpy.ascontiguousarray({what})")
    if writable and not flags.writeable:
        raise InvalidBlock(f"{what} is read-only: pass a writable array")
    dtype = arr.dtype
    if dtype is _U8:
        return arr.ndim == 1
    if dtype.hasobject:
        raise InvalidBlock(f"{what} holds Python objects, not bytes")
    return False


def is_torch_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (of any subclass); False while torch is not imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch(t: Any, what: str, writable: bool) -> ByteView:
    """:func:`view` of a torch tensor; :class:`InvalidBlock` for one whose memory cannot
    be read that way (sparse, non-contiguous, lazy bits, no storage, another device)."""
    if writable and t.requires_grad:  # written behind autograd's back: its gradients would be wrong
        raise InvalidBlock(f"{what} requires grad: read into a tensor that does not (e.g. its .detach())")
    try:
        return _torch_view(t, what)
    except RuntimeError as exc:  # e.g. a fake or nested tensor: torch refuses .numpy() or its sizes
        raise InvalidBlock(f"{what}: torch cannot hand out this tensor's memory ({exc})") from None


def _torch_view(t: Any, what: str) -> ByteView:
    import torch  # the caller's object is a torch tensor: torch is imported already

    if t.layout is not torch.strided:
        raise InvalidBlock(f"{what} is a {t.layout} tensor: call .to_dense()")
    if not t.is_contiguous():
        raise InvalidBlock(f"{what} is not contiguous: call .contiguous() on it")
    if t.is_conj() or t.is_neg():
        raise InvalidBlock(f"{what} has a lazy conjugate/negation bit: call .resolve_conj().resolve_neg()")
    device = t.device
    if device.type == "cpu":
        if not t.data_ptr() and t.nbytes:
            raise InvalidBlock(f"{what} has no memory (a fake or meta tensor): pass a real one")
        flat = t.detach().reshape(-1)  # contiguous: a view
        return (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy()
    if device.type == "cuda":
        handle = _torch_stream(torch, device)
        return DeviceView(t.data_ptr(), t.numel() * t.element_size(), device.index,
                          1 if handle == 0 else handle, False, t)
    raise InvalidBlock(f"{what} is on device {device}: pass a CPU or CUDA tensor")


def _torch_stream(torch: Any, device: Any) -> int:
    """The ``cudaStream_t`` handle of torch's current stream on ``device``: torch's own
    raw-stream query where it has one (what its compiler's generated code calls; a
    tenth of ``torch.cuda.current_stream``'s cost), else that public call."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None and device.index is not None:
        return int(raw(device.index))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _cuda_interface(obj: Any, cai: dict, what: str, writable: bool) -> DeviceView:
    if cai.get("mask") is not None:
        raise InvalidBlock(f"{what} is a masked array: pass its data")
    shape = tuple(map(int, cai["shape"]))
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides")  # None: C-contiguous
    if strides is not None and math.prod(shape) and any(
            n > 1 and s != c for n, s, c in zip(shape, strides, _c_strides(shape, itemsize))):
        raise InvalidBlock(f"{what} is not C-contiguous: make a contiguous copy (e.g. cupy.ascontiguousarray)")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise InvalidBlock(f"{what} is read-only device memory: pass a writable array")
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if stream == 0:
        raise InvalidBlock(f"{what}: __cuda_array_interface__ stream 0 is disallowed by the interface (use 1 or 2)")
    device = getattr(getattr(obj, "device", None), "id", None)
    return DeviceView(int(ptr or 0), math.prod(shape) * itemsize, device if isinstance(device, int) else None,
                      stream, bool(readonly), obj)


def _buffer(mv: memoryview, what: str, writable: bool) -> np.ndarray:
    if not mv.c_contiguous:
        raise InvalidBlock(f"{what} is not C-contiguous: pass a contiguous copy (e.g. bytes({what}))")
    if writable and mv.readonly:
        raise InvalidBlock(f"{what} is read-only: pass a writable buffer (e.g. a bytearray)")
    return np.frombuffer(mv, dtype=np.uint8)


def _dlpack(obj: Any, what: str, writable: bool) -> ByteView:
    kind, device = obj.__dlpack_device__()
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        return _numpy(_from_dlpack_host(obj, what), what, writable)
    if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
        try:
            import cupy
        except ImportError:
            raise InvalidBlock(f"{what} is a DLPack tensor in CUDA memory: pip install 'cascade-kv[gpu]' "
                               "(cupy) to read it") from None
        arr = cupy.from_dlpack(obj)
        dv = _cuda_interface(arr, arr.__cuda_array_interface__, what, writable)
        return DeviceView(dv.ptr, dv.nbytes, int(device), dv.stream, dv.readonly, (obj, arr))
    raise InvalidBlock(f"{what} is a DLPack tensor on device type {int(kind)}: pass host or CUDA memory")


def _from_dlpack_host(obj: Any, what: str) -> np.ndarray:
    try:
        return np.from_dlpack(obj)
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise InvalidBlock(f"{what}: numpy cannot read this DLPack tensor ({exc}); pass a numpy array, "
                           "a torch tensor or an object with the buffer protocol") from None


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
