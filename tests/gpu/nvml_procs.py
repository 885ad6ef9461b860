"""Prints NVML's per-process device-memory usage on device 0 as JSON {pid: bytes}.

tests/gpu/check.sh compares it with Quanta's ledger. Uses libnvidia-ml.so.1 through ctypes
(the real one on a GPU machine, simgpu's under --sim), so it needs nothing installed.
"""
import ctypes
import json
import sys


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t as _v3 fills it
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def main():
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        print(json.dumps({"error": "nvmlInit_v2 failed"}))
        return 1
    device = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) != 0:
        print(json.dumps({"error": "nvmlDeviceGetHandleByIndex_v2(0) failed"}))
        return 1
    infos = (ProcessInfo * 256)()
    count = ctypes.c_uint(256)
    rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(device, ctypes.byref(count), infos)
    if rc != 0:
        print(json.dumps({"error": f"nvmlDeviceGetComputeRunningProcesses_v3 returned {rc}"}))
        return 1
    print(json.dumps({str(infos[i].pid): infos[i].usedGpuMemory for i in range(count.value)}))
    nvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
