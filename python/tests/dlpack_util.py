"""A DLPack exporter made with ctypes, for tests that need tensors in memory no installed library
exports: "CUDA tensors" (DLPack device type 2) over the CUDA/NCCL stand-in's device memory
(test_nccl_standin.py), or over host memory that must never be read (a CPU build's refusal,
test_fake.py).

DLPack's ABI as torch 1.13 exports it (dlpack.h v0.x): DLManagedTensor { DLTensor dl_tensor;
void* manager_ctx; void (*deleter)(DLManagedTensor*); } in a PyCapsule named "dltensor". The
consumer keeps the capsule while it uses the memory; the capsule's destructor here calls the
deleter unless a consumer renamed it "used_dltensor" (and then called the deleter itself)."""
import ctypes

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_OPENCL, KDL_CUDA_MANAGED = 1, 2, 3, 4, 13
_CODES = {"i": 0, "u": 1, "f": 2}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_DESTRUCTOR
def _capsule_destructor(capsule):
    if _api.PyCapsule_IsValid(capsule, _NAME):        # not consumed: the deleter is ours to call
        m = ctypes.cast(_api.PyCapsule_GetPointer(capsule, _NAME), ctypes.POINTER(DLManagedTensor))
        m.contents.deleter(m)


_live = {}          # address of a DLManagedTensor -> (it, its shape and strides, its exporter)


@_DELETER
def _deleter(m):
    addr = ctypes.addressof(m.contents)
    _, _, owner = _live.pop(addr)
    owner.deleted += 1


class Exporter:
    """Memory at address ptr (nbytes) exported as a DLPack tensor of dtype (a numpy dtype),
    shape and strides (elements; None: compact), on device (type, id). Records each
    __dlpack__ call's stream argument (streams) and counts exports and deleter calls, so a test
    sees what the consumer asked for and that it released every capsule. __dlpack_device__
    (DLPack's way to say the device before exporting) only where announce is true."""

    def __init__(self, ptr, nbytes, dtype=np.float32, shape=None, strides=None, device=(KDL_CUDA, 0)):
        self.ptr, self.nbytes = ptr, nbytes
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape) if shape is not None else (nbytes // self.dtype.itemsize,)
        self.strides = strides
        self.device = device
        self.streams = []
        self.exports = 0
        self.deleted = 0

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        n = len(self.shape)
        shape = (ctypes.c_int64 * n)(*self.shape)
        strides = (ctypes.c_int64 * n)(*self.strides) if self.strides is not None else None
        m = DLManagedTensor()
        t = m.dl_tensor
        t.data = self.ptr
        t.device = DLDevice(*self.device)
        t.ndim = n
        t.dtype = DLDataType(_CODES[self.dtype.kind], self.dtype.itemsize * 8, 1)
        t.shape = shape
        t.strides = strides
        t.byte_offset = 0
        m.deleter = _deleter
        _live[ctypes.addressof(m)] = (m, (shape, strides), self)
        self.exports += 1
        return _api.PyCapsule_New(ctypes.addressof(m), _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


class AnnouncingExporter(Exporter):
    """An Exporter that says its device before exporting, as DLPack's producers do."""

    def __dlpack_device__(self):
        return self.device
