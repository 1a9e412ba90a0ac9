"""Build schema-true Nsight Systems and nvprof SQLite files of a small PyTorch DDP job.

No GPU or NVIDIA tool runs here, so the importers are tested on databases written with
sqlite3 following NVIDIA's documented schemas: the nsys 2024.6 export (EXPORT_SCHEMA_VERSION
3.16.1; the columns of each table in their documented order) and nvprof's
``--export-profile`` database (``StringTable``, ``CUPTI_ACTIVITY_KIND_*`` with ``_id_``).

A tiny timeline simulator plays what torch does under ``emit_nvtx``: per step a data load
(pinned HtoD copies), a forward pass (conv → bn → relu → linear → loss, each an NVTX range
nesting the aten calls, kernels launched by ``cudaLaunchKernel`` inside the innermost),
a backward pass on the autograd thread with DDP all-reduces on a NCCL stream, and an SGD
update (``_foreach_add_`` after the all-reduce finished, ``zero_grad`` memsets). Kernels run
on their stream when it is free and not before their launch; a few rows are deliberately
odd: a kernel whose correlation id has no API call, a kernel launched outside any range, an
NVTX start/end range on the pin-memory thread, an NVTX mark, and a launcher process with
NVTX only. ``python tests/nvidia_sqlite.py OUT.sqlite [--nvprof]`` writes one file.
"""

from __future__ import annotations

import sqlite3
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

LAUNCH = "cudaLaunchKernel_v7000"
MEMCPY_ASYNC = "cudaMemcpyAsync_v3020"
MEMSET_ASYNC = "cudaMemsetAsync_v3020"
SYNC = "cudaStreamSynchronize_v3020"
CBID = {LAUNCH: 211, MEMCPY_ASYNC: 41, MEMSET_ASYNC: 51, SYNC: 131}  # cupti_runtime_cbid.h
COMPUTE, NCCL_STREAM = 7, 13


@dataclass(frozen=True)
class Kernel:
    """A kernel's three names as CUPTI reports them."""

    demangled: str
    short: str
    mangled: str


K = {
    "conv": Kernel("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, "
                   "false, true>(int, int, int, float const*, int, float*, float const*, "
                   "kernel_conv_params, unsigned long long, int, float, float, int, "
                   "float const*, float const*, bool, int, int)",
                   "implicit_convolve_sgemm", "_Z23implicit_convolve_sgemmIffLi128ELi5EEv"),
    "bn": Kernel("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>"
                 "(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
                 "float const*, float, float, float*, float*, float*, float*, float, float)",
                 "bn_fw_tr_1C11_kernel_NCHW", "_ZN5cudnn25bn_fw_tr_1C11_kernel_NCHWIffiLi512EEv"),
    "relu": Kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                   "(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, "
                   "c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::"
                   "{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
                   "{lambda(float)#1}, at::detail::Array<char*, 2> >(int, float, "
                   "at::detail::Array<char*, 2>)", "vectorized_elementwise_kernel",
                   "_ZN2at6native29vectorized_elementwise_kernelILi4EclampEEviT0_T1_"),
    "gemm": Kernel("ampere_sgemm_32x128_tn", "ampere_sgemm_32x128_tn",
                   "ampere_sgemm_32x128_tn"),
    "softmax": Kernel("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, "
                      "float, (anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, "
                      "float const*, int)", "cunn_SoftMaxForward",
                      "_ZN12_GLOBAL__N_119cunn_SoftMaxForwardILi4EfffNS_EEvPT2_PKT0_i"),
    "nll": Kernel("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_"
                  "kernel_2d<float, float, long>(float*, float*, float const*, long const*, "
                  "float const*, bool, long, long, long, long)",
                  "nll_loss_forward_reduce_cuda_kernel_2d",
                  "_ZN2at6native38nll_loss_forward_reduce_cuda_kernel_2dIfflEEvPT_"),
    "nll_bw": Kernel("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_"
                     "kernel_2d<float, long>(float*, float const*, long const*, float const*, "
                     "float const*, bool, int, int, long, long)",
                     "nll_loss_backward_reduce_cuda_kernel_2d",
                     "_ZN2at6native39nll_loss_backward_reduce_cuda_kernel_2dIflEEvPT_"),
    "relu_bw": Kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                      "threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
                      "{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, "
                      "at::detail::Array<char*, 3>)", "vectorized_elementwise_kernel",
                      "_ZN2at6native29vectorized_elementwise_kernelILi4EthresholdEEviT0_T1_"),
    "bn_bw": Kernel("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>"
                    "(float, float, float, float, cudnnTensorStruct, float const*, "
                    "cudnnTensorStruct, float const*, cudnnTensorStruct, float*, "
                    "float const*, float*, float*, float const*, float const*, float)",
                    "bn_bw_1C11_kernel_new", "_ZN5cudnn21bn_bw_1C11_kernel_newIffEEv"),
    "dgrad": Kernel("void cudnn::cnn::dgrad2d_grouped_direct_kernel<float, int, float, float, "
                    "false, false, 0, 0, 0>(cudnnTensorStruct, float const*, "
                    "cudnnFilterStruct, float const*, cudnnConvolutionStruct, "
                    "cudnnTensorStruct, float*, float, float)",
                    "dgrad2d_grouped_direct_kernel", "_ZN5cudnn3cnn29dgrad2d_groupedEv"),
    "wgrad": Kernel("void cudnn::cnn::wgrad2d_grouped_direct_kernel<false, true, int, float, "
                    "float, float>(cudnnTensorStruct, float const*, cudnnTensorStruct, "
                    "float const*, cudnnConvolutionStruct, cudnnFilterStruct, float*, float, "
                    "float)", "wgrad2d_grouped_direct_kernel",
                    "_ZN5cudnn3cnn29wgrad2d_groupedEv"),
    "nccl": Kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
                   "ncclWork*)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LLP11ncclDevCommmP8ncclWork"),
    "sgd": Kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::"
                  "native::(anonymous namespace)::TensorListMetadata<2>, at::native::"
                  "(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
                  "std::plus<float>, float>(at::native::(anonymous namespace)::"
                  "TensorListMetadata<2>, at::native::(anonymous namespace)::"
                  "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)",
                  "multi_tensor_apply_kernel", "_ZN2at6native25multi_tensor_apply_kernelEv"),
    "copy": Kernel("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_"
                   "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const"
                   "::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::detail::"
                   "Array<char*, 2>)", "unrolled_elementwise_kernel",
                   "_ZN2at6native27unrolled_elementwise_kernelIcopyEEviT_"),
    "fill": Kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                   "FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::"
                   "FillFunctor<float>, at::detail::Array<char*, 1>)",
                   "vectorized_elementwise_kernel",
                   "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_T1_"),
}


@dataclass
class Timeline:
    """What one simulated job recorded: CUDA API calls, GPU work, NVTX ranges."""

    runtime: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    memcpy: list[dict] = field(default_factory=list)
    memset: list[dict] = field(default_factory=list)
    nvtx: list[dict] = field(default_factory=list)
    devices: dict[int, int] = field(default_factory=dict)  # pid -> CUDA device
    next_corr: int = 100
    free: dict = field(default_factory=lambda: defaultdict(int))

    def _corr(self) -> int:
        self.next_corr += 1
        return self.next_corr

    def _gpu(self, pid: int, stream: int, ready: int, dur: int, after: int) -> tuple[int, int]:
        start = max(self.free[(pid, stream)], ready, after)
        self.free[(pid, stream)] = start + dur
        return start, start + dur

    def launch(self, pid: int, tid: int, t: int, kernel: Kernel, dur: int,
               stream: int = COMPUTE, after: int = 0) -> tuple[int, int]:
        """cudaLaunchKernel at host time t; returns (host time after the call, kernel end)."""
        corr = self._corr()
        self.runtime.append(dict(pid=pid, tid=tid, start=t, end=t + 4_000, corr=corr, api=LAUNCH))
        start, end = self._gpu(pid, stream, t + 3_000, dur, after)
        self.kernels.append(dict(pid=pid, stream=stream, start=start, end=end, corr=corr,
                                 kernel=kernel))
        return t + 4_000, end

    def copy(self, pid: int, tid: int, t: int, nbytes: int, kind: int = 1,
             src: str = "pinned", dst: str = "device") -> int:
        """cudaMemcpyAsync (copyKind 1 = HtoD, 2 = DtoH) on the compute stream."""
        corr = self._corr()
        self.runtime.append(dict(pid=pid, tid=tid, start=t, end=t + 6_000, corr=corr,
                                 api=MEMCPY_ASYNC))
        start, end = self._gpu(pid, COMPUTE, t + 4_000, 2_000 + nbytes // 12_000, 0)
        self.memcpy.append(dict(pid=pid, stream=COMPUTE, start=start, end=end, corr=corr,
                                bytes=nbytes, copy=kind, src=src, dst=dst))
        return t + 6_000

    def sync(self, pid: int, tid: int, t: int) -> int:
        """cudaStreamSynchronize: the host waits until the process's streams are idle."""
        done = max([t, *(v for (p, _), v in self.free.items() if p == pid)]) + 5_000
        self.runtime.append(dict(pid=pid, tid=tid, start=t, end=done, corr=self._corr(),
                                 api=SYNC))
        return done

    def memset_async(self, pid: int, tid: int, t: int, nbytes: int) -> int:
        corr = self._corr()
        self.runtime.append(dict(pid=pid, tid=tid, start=t, end=t + 3_000, corr=corr,
                                 api=MEMSET_ASYNC))
        start, end = self._gpu(pid, COMPUTE, t + 2_000, 1_500, 0)
        self.memset.append(dict(pid=pid, stream=COMPUTE, start=start, end=end, corr=corr,
                                bytes=nbytes))
        return t + 3_000

    def orphan(self, pid: int, kernel: Kernel, ready: int, dur: int) -> int:
        """A kernel whose correlation id matches no recorded API call."""
        start, end = self._gpu(pid, COMPUTE, ready, dur, 0)
        self.kernels.append(dict(pid=pid, stream=COMPUTE, start=start, end=end,
                                 corr=900_000 + len(self.kernels), kernel=kernel))
        return end

    def ranges(self, pid: int, tid: int, t: int, names: list[str], body, etype: int = 59,
               registered: bool = False) -> tuple[int, object]:
        """Nested NVTX ranges (outermost first) around ``body(t) -> (t, result)``."""
        rows = []
        for n in names:
            rows.append(dict(pid=pid, tid=tid, start=t, text=n, type=etype,
                             registered=registered))
            t += 800
        t, result = body(t)
        for row in reversed(rows):
            t += 600
            row["end"] = t
        self.nvtx.extend(rows)
        return t + 300, result


FORWARD = [  # NVTX range names (outermost first) and the kernels the innermost launches
    (["aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"],
     [("conv", 120_000)]),
    (["aten::batch_norm", "aten::_batch_norm_impl_index", "aten::cudnn_batch_norm"],
     [("bn", 40_000)]),
    (["aten::relu_"], [("relu", 10_000)]),
    (["aten::linear", "aten::addmm"], [("gemm", 30_000)]),
    (["aten::cross_entropy_loss", "aten::log_softmax"], [("softmax", 8_000)]),
    (["aten::nll_loss_nd", "aten::nll_loss"], [("nll", 5_000)]),
]
BACKWARD = [  # autograd node, its aten call, kernels; None = a DDP bucket all-reduce
    ("NllLossBackward0", "aten::nll_loss_backward", [("nll_bw", 6_000)]),
    ("AddmmBackward0", "aten::mm", [("gemm", 25_000), ("gemm", 25_000)]),
    None,
    ("ReluBackward0", "aten::threshold_backward", [("relu_bw", 12_000)]),
    ("CudnnBatchNormBackward0", "aten::cudnn_batch_norm_backward", [("bn_bw", 45_000)]),
    ("ConvolutionBackward0", "aten::convolution_backward",
     [("dgrad", 150_000), ("wgrad", 130_000)]),
    None,
]


class _Rank:
    """One training process: its threads, host clock and autograd sequence numbers."""

    def __init__(self, tl: Timeline, r: int, t0: int) -> None:
        self.tl, self.r, self.pid = tl, r, 4242 + r
        self.main, self.autograd, self.pin = self.pid, self.pid + 8, self.pid + 19
        self.t, self.seq, self.backward_done = t0 + r * 37_000, 0, 0
        tl.devices[self.pid] = r

    def op(self, names, kernels, t, tid=None, stream=COMPUTE, after=0) -> tuple[int, int]:
        """NVTX ranges around kernel launches (rank r's kernels run r x 10% longer)."""
        tid = self.main if tid is None else tid

        def body(x):
            end = 0
            for k, d in kernels:
                x, end = self.tl.launch(self.pid, tid, x + 1_500, K[k], d * (10 + self.r) // 10,
                                        stream, after)
            return x + 1_000, end
        return self.tl.ranges(self.pid, tid, t, names, body)

    def marker(self, name: str, body) -> None:
        self.t, _ = self.tl.ranges(self.pid, self.main, self.t, [name],
                                   lambda x: (body(x), None), registered=True)

    def load(self, x: int) -> int:
        for nbytes in (393_216, 256):
            x, _ = self.tl.ranges(self.pid, self.main, x,
                                  ["aten::to", "aten::_to_copy", "aten::copy_"],
                                  lambda y, n=nbytes: (self.tl.copy(self.pid, self.main, y, n),
                                                       None))
        return x

    def forward(self, x: int) -> int:
        for names, kernels in FORWARD:
            self.seq += 1
            x, _ = self.op([f"{names[0]}, seq = {self.seq}, op_id = {self.seq * 10}",
                            *(f"{n}, seq = {self.seq}" for n in names[1:])], kernels, x)
        return x

    def backward(self, x: int) -> int:
        """The main thread waits in .backward() while the autograd thread works."""
        ta, nccl_end = x + 5_000, 0
        for node in BACKWARD:
            if node is None:
                ta, nccl_end = self.op(["nccl:all_reduce"], [("nccl", 300_000)], ta,
                                       tid=self.autograd, stream=NCCL_STREAM)
                continue
            name, aten, kernels = node
            ta, _ = self.op([f"autograd::engine::evaluate_function: {name}",
                             f"{name}, seq = {self.seq}", f"{aten}, seq = {self.seq}"],
                            kernels, ta, tid=self.autograd)
        self.backward_done = max(ta, nccl_end)
        return max(ta, x) + 2_000

    def update(self, x: int) -> int:
        after = self.backward_done + 50_000  # the update waits for the last all-reduce
        x, _ = self.op(["Optimizer.step#SGD.step", "aten::_foreach_add_"], [("sgd", 20_000)],
                       x, after=after)

        def zero(y):
            return self.tl.ranges(self.pid, self.main, y, ["aten::zero_", "aten::fill_"],
                                  lambda z: (self.tl.memset_async(self.pid, self.main, z, 4096),
                                             None))[0]
        x, _ = self.tl.ranges(self.pid, self.main, x, ["Optimizer.zero_grad#SGD.zero_grad"],
                              lambda y: (zero(y), None))
        return x

    def item(self, x: int) -> int:
        """loss.item(): a DtoH copy and a wait for the GPU."""
        x = self.tl.copy(self.pid, self.main, x, 4, kind=2, src="device", dst="pageable")
        return self.tl.sync(self.pid, self.main, x)

    def step(self, n: int) -> None:
        tl, start = self.tl, self.t
        self.t += 150_000  # the host prepares the batch; the GPU waits
        # pin-memory thread: a start/end range while the batch is prepared
        tl.nvtx.append(dict(pid=self.pid, tid=self.pin, start=self.t - 30_000,
                            end=self.t - 2_000, text="pin_memory batch", type=60,
                            registered=False))
        for name, body in (("opprof.load", self.load), ("opprof.forward", self.forward),
                           ("opprof.backward", self.backward), ("opprof.update", self.update)):
            self.marker(name, body)
        # a launch outside every range, and a kernel with no recorded launch
        self.t, _ = tl.launch(self.pid, self.main, self.t + 2_000, K["fill"], 3_000)
        tl.orphan(self.pid, K["copy"], self.t, 4_000)
        self.t, _ = tl.ranges(self.pid, self.main, self.t + 2_000,
                              ["aten::item", "aten::_local_scalar_dense"],
                              lambda x: (self.item(x), None))
        self.t += 2_000
        tl.nvtx.append(dict(pid=self.pid, tid=self.main, start=start, end=self.t,
                            text=f"opprof.step#{n}", type=59, registered=True))
        self.t += 20_000


def torch_job(ranks: int = 2, steps: int = 2, t0: int = 2_000_000_000) -> Timeline:
    """The DDP job: ``ranks`` processes (pid 4242 + r on cuda:r), ``steps`` steps each."""
    tl = Timeline()
    end = t0
    for r in range(ranks):
        rank = _Rank(tl, r, t0)
        tl.nvtx.append(dict(pid=rank.pid, tid=rank.main, start=rank.t, end=None,
                            text="epoch 0", type=34, registered=False))
        for n in range(steps):
            rank.step(n)
        end = max(end, rank.t)
    # a launcher process with NVTX only (no CUDA): left out by the nsys importer
    tl.nvtx.append(dict(pid=4100, tid=4100, start=t0 - 1_000_000, end=end + 1_000_000,
                        text="torchrun", type=59, registered=False))
    return tl


# ---------------------------------------------------------------- Nsight Systems export

NSYS_SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT,
    localTime TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
    busLocation TEXT, isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER,
    memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT,
    luid INTEGER, chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT,
    revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER,
    maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER,
    maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, threadsPerWarp INTEGER,
    asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER,
    maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER,
    maxBlockDimZ INTEGER, maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER,
    computeMajor INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER);
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER NOT NULL,
    pid INTEGER NOT NULL, uuid TEXT, numMultiprocessors INTEGER);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
    launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL,
    gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL,
    gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER,
    sharedMemoryLimitConfig INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER,
    srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER,
    dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER,
    virtualAddress INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
    endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER,
    int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
    floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (34, 'NvtxMark', 'NvtxMark'),
    (59, 'NvtxPushPopRange', 'NvtxPushPopRange'),
    (60, 'NvtxStartEndRange', 'NvtxStartEndRange');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_KIND_HTOD', 'Host-to-Device'),
    (2, 'CUDA_MEMCPY_KIND_DTOH', 'Device-to-Host'), (8, 'CUDA_MEMCPY_KIND_DTOD',
    'Device-to-Device');
INSERT INTO ENUM_CUDA_MEM_KIND VALUES (0, 'CUDA_MEMOPR_MEMORY_KIND_PAGEABLE', 'Pageable'),
    (1, 'CUDA_MEMOPR_MEMORY_KIND_PINNED', 'Pinned'),
    (2, 'CUDA_MEMOPR_MEMORY_KIND_DEVICE', 'Device');
INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2024.6.2.225'),
    ('EXPORT_SCHEMA_VERSION', '3.16.1');
"""
NSYS_MEM = {"pageable": 0, "pinned": 1, "device": 2}
SESSION_UTC_NS = 1_700_000_000_000_000_000
VM = 1 << 48  # the vm/host part of a serialized GlobalId


def gtid(pid: int, tid: int) -> int:
    """nsys's serialized GlobalId of a thread."""
    return VM | (pid << 24) | tid


def write_nsys(path: Path, tl: Timeline) -> Path:
    """Write the timeline as ``nsys export --type sqlite`` would."""
    path = Path(path)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(NSYS_SCHEMA)
    ids: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in ids:
            ids[s] = len(ids) + 1
        return ids[s]

    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)",
                (SESSION_UTC_NS, "2023-11-14T22:13:20Z", "2023-11-14T23:13:20"))
    for pid, dev in tl.devices.items():
        con.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, busLocation, smCount, "
                    "computeMajor, computeMinor) VALUES (1, ?, ?, ?, 108, 8, 0)",
                    (dev, "NVIDIA A100-SXM4-80GB", f"0000:{dev + 7:02x}:00.0"))
        for odev in tl.devices.values():  # every process sees every GPU
            con.execute("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, ?, 108)",
                        (odev, odev, pid, f"GPU-{odev}"))
        con.execute("INSERT INTO PROCESSES VALUES (?, ?, 'python')", (gtid(pid, 0), pid))
    for k in tl.kernels:
        dev = tl.devices[k["pid"]]
        kern = k["kernel"]
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 1, NULL, ?, ?, ?, ?, ?, ?, "
            "1, NULL, 32, 128, 1, 1, 256, 1, 1, 0, 0, 0, 0, ?, 0, NULL, 0)",
            (k["start"], k["end"], dev, k["stream"], k["corr"], gtid(k["pid"], 0),
             sid(kern.demangled), sid(kern.short), sid(kern.mangled), k["corr"]))
    for m in tl.memcpy:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 1, NULL, ?, ?, ?, ?, ?, "
            "NULL, ?, ?, NULL, NULL, ?, 1, NULL, NULL, NULL)",
            (m["start"], m["end"], tl.devices[m["pid"]], m["stream"], m["corr"],
             gtid(m["pid"], 0), m["bytes"], m["copy"], NSYS_MEM[m["src"]],
             NSYS_MEM[m["dst"]], tl.devices[m["pid"]]))
    for m in tl.memset:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, 1, NULL, ?, ?, ?, 0, ?, "
            "NULL, 2)", (m["start"], m["end"], tl.devices[m["pid"]], m["stream"], m["corr"],
                         gtid(m["pid"], 0), m["bytes"]))
    for r in tl.runtime:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                    (r["start"], r["end"], gtid(r["pid"], r["tid"]), r["corr"], sid(r["api"])))
    for n in tl.nvtx:
        text, text_id = (None, sid(n["text"])) if n["registered"] else (n["text"], None)
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, "
                    "endGlobalTid, textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                    (n["start"], n["end"], n["type"], text, gtid(n["pid"], n["tid"]),
                     gtid(n["pid"], n["tid"]) if n["type"] == 60 else None, text_id))
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in ids.items()])
    con.commit()
    con.close()
    return path


# ---------------------------------------------------------------- nvprof --export-profile

_KERNEL_COLS = ("cacheConfig BLOB NOT NULL, sharedMemoryConfig INT NOT NULL, "
                "registersPerThread INT NOT NULL, partitionedGlobalCacheRequested INT NOT NULL, "
                "partitionedGlobalCacheExecuted INT NOT NULL, start INT NOT NULL, "
                "end INT NOT NULL, completed INT NOT NULL, deviceId INT NOT NULL, "
                "contextId INT NOT NULL, streamId INT NOT NULL, gridX INT NOT NULL, "
                "gridY INT NOT NULL, gridZ INT NOT NULL, blockX INT NOT NULL, "
                "blockY INT NOT NULL, blockZ INT NOT NULL, staticSharedMemory INT NOT NULL, "
                "dynamicSharedMemory INT NOT NULL, localMemoryPerThread INT NOT NULL, "
                "localMemoryTotal INT NOT NULL, correlationId INT NOT NULL, "
                "gridId INT NOT NULL, name INT NOT NULL")
NVPROF_SCHEMA = f"""
CREATE TABLE StringTable(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, value TEXT NOT NULL UNIQUE);
CREATE TABLE Version(version INTEGER);
INSERT INTO Version VALUES (12);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    copyKind INT NOT NULL, srcKind INT NOT NULL, dstKind INT NOT NULL, flags INT NOT NULL,
    bytes INT NOT NULL, start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
    contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT NOT NULL,
    runtimeCorrelationId INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    value INT NOT NULL, bytes INT NOT NULL, start INT NOT NULL, end INT NOT NULL,
    deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL,
    correlationId INT NOT NULL, flags INT NOT NULL, memoryKind INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, {_KERNEL_COLS});
CREATE TABLE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    {_KERNEL_COLS});
CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    cbid INT NOT NULL, start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL,
    threadId INT NOT NULL, correlationId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    cbid INT NOT NULL, start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL,
    threadId INT NOT NULL, correlationId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_DEVICE(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    flags INT NOT NULL, globalMemoryBandwidth INT NOT NULL, globalMemorySize INT NOT NULL,
    constantMemorySize INT NOT NULL, l2CacheSize INT NOT NULL, numThreadsPerWarp INT NOT NULL,
    coreClockRate INT NOT NULL, numMemcpyEngines INT NOT NULL, numMultiprocessors INT NOT NULL,
    maxIPC INT NOT NULL, maxWarpsPerMultiprocessor INT NOT NULL,
    maxBlocksPerMultiprocessor INT NOT NULL, maxSharedMemoryPerMultiprocessor INT NOT NULL,
    maxRegistersPerMultiprocessor INT NOT NULL, maxRegistersPerBlock INT NOT NULL,
    maxSharedMemoryPerBlock INT NOT NULL, maxThreadsPerBlock INT NOT NULL,
    maxBlockDimX INT NOT NULL, maxBlockDimY INT NOT NULL, maxBlockDimZ INT NOT NULL,
    maxGridDimX INT NOT NULL, maxGridDimY INT NOT NULL, maxGridDimZ INT NOT NULL,
    computeCapabilityMajor INT NOT NULL, computeCapabilityMinor INT NOT NULL, id INT NOT NULL,
    eccEnabled INT NOT NULL, uuid BLOB NOT NULL, name INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_NAME(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    objectKind INT NOT NULL, objectId BLOB NOT NULL, name INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    flags INT NOT NULL, timestamp INT NOT NULL, id INT NOT NULL, objectKind INT NOT NULL,
    objectId BLOB NOT NULL, name INT NOT NULL, domain INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER_DATA(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
    flags INT NOT NULL, id INT NOT NULL, payloadKind INT NOT NULL, payload BLOB NOT NULL,
    color INT NOT NULL, category INT NOT NULL);
"""
CUPTI_MEM = {"pageable": 1, "pinned": 2, "device": 3}  # CUpti_ActivityMemoryKind
EPOCH_NS = 1_500_000_000_000_000_000  # nvprof stores absolute CUPTI timestamps


def write_nvprof(path: Path, tl: Timeline, pid: int = 4242) -> Path:
    """Write one process of the timeline as ``nvprof --export-profile`` would; NVTX thread
    markers are a start row (flags 2, name) and an end row (flags 4, name 0) sharing an id."""
    path = Path(path)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(NVPROF_SCHEMA)

    def sid(s: str) -> int:
        row = con.execute("SELECT _id_ FROM StringTable WHERE value = ?", (s,)).fetchone()
        if row:
            return row[0]
        return con.execute("INSERT INTO StringTable (value) VALUES (?)", (s,)).lastrowid

    dev = tl.devices[pid]
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_DEVICE VALUES (NULL, 0, 1555200000, "
                "17071734784, 65536, 6291456, 32, 1380000, 6, 80, 4, 64, 32, 98304, 65536, "
                "65536, 49152, 1024, 1024, 1024, 64, 2147483647, 65535, 65535, 7, 0, ?, 1, "
                "?, ?)", (dev, b"\x00" * 16, sid("Tesla V100-SXM2-16GB")))
    for k in (k for k in tl.kernels if k["pid"] == pid):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL VALUES (NULL, ?, 0, "
                    "32, 0, 0, ?, ?, ?, ?, 1, ?, 128, 1, 1, 256, 1, 1, 0, 0, 0, 0, ?, ?, ?)",
                    (b"\x00", EPOCH_NS + k["start"], EPOCH_NS + k["end"],
                     EPOCH_NS + k["end"], dev, k["stream"], k["corr"], k["corr"],
                     sid(k["kernel"].mangled)))
    for m in (m for m in tl.memcpy if m["pid"] == pid):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (NULL, ?, ?, ?, 1, ?, ?, ?, "
                    "?, 1, ?, ?, ?)",
                    (m["copy"], CUPTI_MEM[m["src"]], CUPTI_MEM[m["dst"]], m["bytes"],
                     EPOCH_NS + m["start"], EPOCH_NS + m["end"], dev, m["stream"], m["corr"],
                     m["corr"]))
    for m in (m for m in tl.memset if m["pid"] == pid):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (NULL, 0, ?, ?, ?, ?, 1, ?, "
                    "?, 1, 3)", (m["bytes"], EPOCH_NS + m["start"], EPOCH_NS + m["end"], dev,
                                 m["stream"], m["corr"]))
    for r in (r for r in tl.runtime if r["pid"] == pid):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (NULL, ?, ?, ?, ?, ?, ?, 0)",
                    (CBID[r["api"]], EPOCH_NS + r["start"], EPOCH_NS + r["end"], pid, r["tid"],
                     r["corr"]))
    marker_id = 0
    for n in (n for n in tl.nvtx if n["pid"] == pid):
        marker_id += 1
        obj = struct.pack("<III", pid, n["tid"], 0)  # CUpti_ActivityObjectKindId.pt
        if n["end"] is None:  # an instantaneous mark
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER VALUES (NULL, 1, ?, ?, 2, ?, ?, "
                        "0)", (EPOCH_NS + n["start"], marker_id, obj, sid(n["text"])))
            continue
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER VALUES (NULL, 2, ?, ?, 2, ?, ?, 0)",
                    (EPOCH_NS + n["start"], marker_id, obj, sid(n["text"])))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER VALUES (NULL, 4, ?, ?, 2, ?, 0, 0)",
                    (EPOCH_NS + n["end"], marker_id, obj))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER_DATA VALUES (NULL, 2, ?, 0, ?, "
                    "4278190335, 0)", (marker_id, b"\x00" * 8))
    con.commit()
    con.close()
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "job.sqlite")
    job = torch_job()
    print(write_nvprof(out, job) if "--nvprof" in sys.argv else write_nsys(out, job))
