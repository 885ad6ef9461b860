// Driver entry points for graphs: kernel, memory-allocation and free nodes, stream capture,
// instantiation and launch. A launched graph is queued as its kernels' total duration and
// then runs its free nodes.
#include <memory>
#include <vector>

#include "tests/simgpu/launch.h"
#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

struct CUgraphExec_st {
  uint64_t duration_ns = 0;
  std::vector<CUdeviceptr> frees;  // what its free nodes free, each time it runs
};

namespace {

CUresult add_node(CUgraphNode* phGraphNode, CUgraph hGraph, std::unique_ptr<CUgraphNode_st> node) {
  if (phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(hGraph, HandleKind::Graph)) return CUDA_ERROR_INVALID_VALUE;
  *phGraphNode = add_graph_node(hGraph, std::move(node));
  return CUDA_SUCCESS;
}

CUresult add_kernel_node(CUgraphNode* phGraphNode, CUgraph hGraph, CUfunction func,
                         void** kernelParams, void** extra) {
  SIMGPU_REQUIRE_INIT();
  CUfunc_st* fn = resolve_function(func);
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<CUgraphNode_st>();
  node->type = GraphNodeType::Kernel;
  // Parameters are captured by value at node creation, as the driver does.
  node->duration_ns = kernel_duration_ns(fn, kernelParams, extra);
  return add_node(phGraphNode, hGraph, std::move(node));
}

CUresult instantiate(CUgraphExec* phGraphExec, CUgraph hGraph) {
  SIMGPU_REQUIRE_INIT();
  if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(hGraph, HandleKind::Graph)) return CUDA_ERROR_INVALID_VALUE;
  auto* exec = new CUgraphExec_st();
  for (const auto& n : hGraph->nodes) {
    if (n->type == GraphNodeType::Kernel) exec->duration_ns += n->duration_ns;
    if (n->type == GraphNodeType::MemFree) exec->frees.push_back(n->dptr);
  }
  add_handle(exec, HandleKind::GraphExec);
  *phGraphExec = exec;
  return CUDA_SUCCESS;
}

CUresult graph_launch(CUgraphExec exec, CUstream h) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(exec, HandleKind::GraphExec)) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (s != nullptr && s->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  enqueue_work(ctx, s, exec->duration_ns);
  // Free nodes free when the graph runs (here: at launch, as every stream-ordered free in
  // simgpu happens at its enqueue). A pointer already freed by an earlier launch is skipped.
  for (CUdeviceptr p : exec->frees) free_device_memory(p);
  return CUDA_SUCCESS;
}

CUresult begin_capture(CUstream h) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  // The legacy and per-thread default streams cannot be captured.
  if (s == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto* g = new CUgraph_st();
  add_handle(g, HandleKind::Graph);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  s->capture = g;
  s->capture_id = rt.next_capture_id++;
  return CUDA_SUCCESS;
}

CUresult end_capture(CUstream h, CUgraph* phGraph) {
  SIMGPU_REQUIRE_INIT();
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (s == nullptr || s->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  *phGraph = s->capture;
  s->capture = nullptr;
  return CUDA_SUCCESS;
}

CUresult capture_status(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id) {
  SIMGPU_REQUIRE_INIT();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  const bool active = s != nullptr && s->capture != nullptr;
  *status = active ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id != nullptr && active) *id = s->capture_id;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

// Stream capture: work, stream-ordered allocations and frees on a capturing stream become
// nodes of its graph (kernels and copies by their duration) instead of running.
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode) {
  return begin_capture(hStream);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode) {
  return begin_capture(hStream);
}
CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end_capture(hStream, phGraph);
}
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end_capture(hStream, phGraph);
}
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return capture_status(hStream, captureStatus, nullptr);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return capture_status(hStream, captureStatus, nullptr);
}
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                cuuint64_t* id_out) {
  return capture_status(hStream, captureStatus_out, id_out);
}
CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                     cuuint64_t* id_out) {
  return capture_status(hStream, captureStatus_out, id_out);
}

CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  SIMGPU_REQUIRE_INIT();
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* g = new CUgraph_st();
  add_handle(g, HandleKind::Graph);
  *phGraph = g;
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hGraph, HandleKind::Graph)) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& n : hGraph->nodes) remove_handle(n.get());
  remove_handle(hGraph);
  delete hGraph;
  return CUDA_SUCCESS;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*,
                                 size_t, const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return add_kernel_node(phGraphNode, hGraph, nodeParams->func, nodeParams->kernelParams,
                         nodeParams->extra);
}
CUresult cuGraphAddKernelNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*, size_t,
                              const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return add_kernel_node(phGraphNode, hGraph, nodeParams->func, nodeParams->kernelParams,
                         nodeParams->extra);
}

CUresult cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*, size_t) {
  SIMGPU_REQUIRE_INIT();
  return add_node(phGraphNode, hGraph, std::make_unique<CUgraphNode_st>());
}

// The allocation is made (and charged) when the node is added and lives until it is
// freed with cuMemFree (a free node does nothing); the driver instead
// charges it per launch. Only the address and the capacity are observable here.
CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*,
                                size_t, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (nodeParams == nullptr || !has_handle(hGraph, HandleKind::Graph))
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  if (CUresult r = allocate_device_memory(ctx, nodeParams->bytesize, AllocKind::Pool, &p);
      r != CUDA_SUCCESS)
    return r;
  auto node = std::make_unique<CUgraphNode_st>();
  node->type = GraphNodeType::MemAlloc;
  node->dptr = p;
  nodeParams->dptr = p;
  return add_node(phGraphNode, hGraph, std::move(node));
}

CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*, size_t,
                               CUdeviceptr dptr) {
  SIMGPU_REQUIRE_INIT();
  auto node = std::make_unique<CUgraphNode_st>();
  node->type = GraphNodeType::MemFree;
  node->dptr = dptr;
  return add_node(phGraphNode, hGraph, std::move(node));
}

// The generic node API (CUDA 12.2+): kernel, allocation, free and empty nodes; other
// node types are not modelled.
CUresult cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*,
                           const CUgraphEdgeData*, size_t, CUgraphNodeParams* nodeParams) {
  SIMGPU_REQUIRE_INIT();
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (nodeParams->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS_v3& k = nodeParams->kernel;
      CUfunction f = k.func ? k.func : reinterpret_cast<CUfunction>(k.kern);
      return add_kernel_node(phGraphNode, hGraph, f, k.kernelParams, k.extra);
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      CUDA_MEM_ALLOC_NODE_PARAMS legacy{};
      legacy.poolProps = nodeParams->alloc.poolProps;
      legacy.bytesize = nodeParams->alloc.bytesize;
      CUresult r = cuGraphAddMemAllocNode(phGraphNode, hGraph, nullptr, 0, &legacy);
      if (r == CUDA_SUCCESS) nodeParams->alloc.dptr = legacy.dptr;
      return r;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return cuGraphAddMemFreeNode(phGraphNode, hGraph, nullptr, 0, nodeParams->free.dptr);
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return cuGraphAddEmptyNode(phGraphNode, hGraph, nullptr, 0);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}
CUresult cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* deps, size_t n,
                        CUgraphNodeParams* nodeParams) {
  return cuGraphAddNode_v2(phGraphNode, hGraph, deps, nullptr, n, nodeParams);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long) {
  return instantiate(phGraphExec, hGraph);
}
CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode*, char*, size_t) {
  return instantiate(phGraphExec, hGraph);
}
CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode*, char*,
                               size_t) {
  return instantiate(phGraphExec, hGraph);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  CUresult r = instantiate(phGraphExec, hGraph);
  if (params != nullptr)
    params->result_out =
        r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return cuGraphInstantiateWithParams(phGraphExec, hGraph, params);
}

CUresult cuGraphUpload(CUgraphExec exec, CUstream) {
  SIMGPU_REQUIRE_INIT();
  return has_handle(exec, HandleKind::GraphExec) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream s) {
  return cuGraphUpload(exec, s);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch(hGraphExec, hStream);
}
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch(hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hGraphExec, HandleKind::GraphExec)) return CUDA_ERROR_INVALID_VALUE;
  remove_handle(hGraphExec);
  delete hGraphExec;
  return CUDA_SUCCESS;
}

}  // extern "C"
