// Driver entry points for streams and events, with their per-thread-default-stream
// (_ptsz) twins. Events are zero-length points in their context's work stream.
#include <thread>

#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

namespace {

CUresult create_stream(CUstream* phStream, unsigned flags, int priority) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* s = new CUstream_st();
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  add_handle(s, HandleKind::Stream);
  *phStream = s;
  return CUDA_SUCCESS;
}

CUresult stream_synchronize(CUstream h) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (s != nullptr && s->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  engine_for(ctx->device).wait(stream_tail(ctx, s));
  release_pool_memory_at_sync();
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream h) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (s != nullptr && s->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return engine_for(ctx->device).is_complete(stream_tail(ctx, s)) ? CUDA_SUCCESS
                                                                  : CUDA_ERROR_NOT_READY;
}

CUresult stream_wait_event(CUstream h, CUevent ev, unsigned) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (!has_handle(ev, HandleKind::Event)) return CUDA_ERROR_INVALID_HANDLE;
  if (!ev->recorded) return CUDA_SUCCESS;
  // Within a context work is serial, so the event is already ahead of anything queued
  // next. Across contexts the host waits, which orders the work the same way.
  if (ev->ticket.device != physical_device(ctx->device) || ev->ticket.slot != ctx->slot)
    engine_of(ev->ticket).wait(ev->ticket);
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent ev, CUstream h) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(ev, HandleKind::Event)) return CUDA_ERROR_INVALID_HANDLE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  DeviceEngine engine = engine_for(ctx->device);
  ev->ctx = ctx;
  ev->recorded = true;
  ev->ticket = stream_tail(ctx, s);
  // An event recorded behind no pending work completes now, not when the last slice ended.
  ev->time_known = false;
  if (engine.is_complete(ev->ticket)) {
    ev->time_known = true;
    ev->time_ns = monotonic_ns();
  }
  return CUDA_SUCCESS;
}

bool event_time(CUevent ev, uint64_t& t) {
  if (!ev->time_known) {
    if (!engine_of(ev->ticket).completion_time(ev->ticket, ev->time_ns)) return false;
    ev->time_known = true;
  }
  t = ev->time_ns;
  return true;
}

struct HostCall {
  CUhostFn fn;
  void* data;
  Ticket ticket;
};

CUresult launch_host_func(CUstream h, CUhostFn fn, void* userData) {
  SIMGPU_REQUIRE_INIT();
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  HostCall call{fn, userData, stream_tail(ctx, s)};
  // The call runs once the work queued before it is done; later work does not wait for
  // it (a simplification of the driver, which would hold the stream).
  std::thread([call] {
    engine_of(call.ticket).wait(call.ticket);
    call.fn(call.data);
  }).detach();
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return create_stream(phStream, Flags, 0);
}
CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return create_stream(phStream, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hStream, HandleKind::Stream)) return CUDA_ERROR_INVALID_HANDLE;
  remove_handle(hStream);
  delete hStream;
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream hStream) {
  return cuStreamDestroy_v2(hStream);
}

CUresult cuStreamSynchronize(CUstream hStream) {
  return stream_synchronize(hStream);
}
CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return stream_synchronize(hStream);
}
CUresult cuStreamQuery(CUstream hStream) {
  return stream_query(hStream);
}
CUresult cuStreamQuery_ptsz(CUstream hStream) {
  return stream_query(hStream);
}
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return stream_wait_event(hStream, hEvent, Flags);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return stream_wait_event(hStream, hEvent, Flags);
}

static CUresult stream_get_priority(CUstream h, int* priority) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *priority = s ? s->priority : 0;
  return CUDA_SUCCESS;
}
CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  return stream_get_priority(hStream, priority);
}
CUresult cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  return stream_get_priority(hStream, priority);
}

static CUresult stream_get_flags(CUstream h, unsigned int* flags) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = s ? s->flags : 0;
  return CUDA_SUCCESS;
}
CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return stream_get_flags(hStream, flags);
}
CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  return stream_get_flags(hStream, flags);
}

static CUresult stream_get_ctx(CUstream h, CUcontext* pctx) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = ctx;
  return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return stream_get_ctx(hStream, pctx);
}
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return stream_get_ctx(hStream, pctx);
}

CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  if (pGreenCtx != nullptr) *pGreenCtx = nullptr;
  return stream_get_ctx(hStream, pCtx);
}
CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return cuStreamGetCtx_v2(hStream, pCtx, pGreenCtx);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return launch_host_func(hStream, fn, userData);
}
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return launch_host_func(hStream, fn, userData);
}

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* ev = new CUevent_st();
  ev->ctx = ctx;
  ev->flags = Flags;
  add_handle(ev, HandleKind::Event);
  *phEvent = ev;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hEvent, HandleKind::Event)) return CUDA_ERROR_INVALID_HANDLE;
  remove_handle(hEvent);
  delete hEvent;
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent hEvent) {
  return cuEventDestroy_v2(hEvent);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return event_record(hEvent, hStream);
}
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return event_record(hEvent, hStream);
}
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int) {
  return event_record(hEvent, hStream);
}
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int) {
  return event_record(hEvent, hStream);
}

CUresult cuEventQuery(CUevent hEvent) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hEvent, HandleKind::Event)) return CUDA_ERROR_INVALID_HANDLE;
  if (!hEvent->recorded) return CUDA_SUCCESS;
  return engine_of(hEvent->ticket).is_complete(hEvent->ticket) ? CUDA_SUCCESS
                                                               : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hEvent, HandleKind::Event)) return CUDA_ERROR_INVALID_HANDLE;
  if (hEvent->recorded) engine_of(hEvent->ticket).wait(hEvent->ticket);
  release_pool_memory_at_sync();
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  SIMGPU_REQUIRE_INIT();
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(hStart, HandleKind::Event) || !has_handle(hEnd, HandleKind::Event))
    return CUDA_ERROR_INVALID_HANDLE;
  if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!hStart->recorded || !hEnd->recorded) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t t0 = 0, t1 = 0;
  if (!event_time(hStart, t0) || !event_time(hEnd, t1)) return CUDA_ERROR_NOT_READY;
  *pMilliseconds = static_cast<float>((static_cast<double>(t1) - static_cast<double>(t0)) / 1e6);
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

}  // extern "C"
