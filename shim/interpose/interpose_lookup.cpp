// Lookup overrides: the ways a program finds driver entry points other than linking them.
//  - cuGetProcAddress / _v2: the real driver answers first (it alone knows which variant
//    a cudaVersion and per-thread-stream flag select); the entry it returned is then
//    swapped for the shim's wrapper of exactly that exported variant, so the ABI is
//    always the one the caller asked for. Entries the shim does not wrap pass through.
//  - dlsym: a lookup on a specific handle whose answer lies in libcuda (or NVML) gets the
//    wrapper of exactly that name; RTLD_DEFAULT/RTLD_NEXT and everything else reach glibc
//    untouched. The export is a small trampoline that *jumps* to glibc's dlsym, so glibc
//    still sees the original caller (RTLD_NEXT is relative to the caller). It cannot
//    recurse: lookups made by the driver itself, or while the shim is resolving, pass
//    straight through.
#define __CUDA_API_VERSION_INTERNAL 1
#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "shim/base/log.h"
#include "shim/base/options.h"
#include "shim/interpose/real_driver.h"
#include "shim/interposed.h"

using namespace quanta::shim;

namespace {

#define QUANTA_TABLE_ENTRY(fn) {#fn, reinterpret_cast<void*>(&::fn)},
const Interposed kCudaInterposed[] = {QUANTA_CUDA_INTERPOSED(QUANTA_TABLE_ENTRY)};
constexpr size_t kCudaCount = sizeof kCudaInterposed / sizeof kCudaInterposed[0];

// The real driver's address of each interposed name, filled at the first
// cuGetProcAddress (nullptr where the driver lacks it).
std::atomic<void*> g_real_address[kCudaCount];
std::atomic<bool> g_real_addresses_known{false};

void learn_real_addresses() {
  if (g_real_addresses_known.load(std::memory_order_acquire)) return;
  for (size_t i = 0; i < kCudaCount; ++i)
    g_real_address[i].store(real_driver_symbol(kCudaInterposed[i].name), std::memory_order_relaxed);
  g_real_addresses_known.store(true, std::memory_order_release);
}

bool ends_with(const char* text, const char* suffix) {
  const size_t n = strlen(text), m = strlen(suffix);
  return n >= m && !strcmp(text + n - m, suffix);
}

// The wrapper for the real entry `entry` that cuGetProcAddress returned for `symbol`.
// Should two exported names share one real address (a driver aliasing identical ABIs),
// the one named like the request, in the requested stream flavour, wins.
void* wrapper_for_real_entry(void* entry, const char* symbol, cuuint64_t flags) {
  learn_real_addresses();
  const bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const size_t symbol_length = symbol ? strlen(symbol) : 0;
  const Interposed* best = nullptr;
  int best_score = -1;
  for (size_t i = 0; i < kCudaCount; ++i) {
    if (g_real_address[i].load(std::memory_order_relaxed) != entry) continue;
    const char* name = kCudaInterposed[i].name;
    const bool named_like = symbol && !strncmp(name, symbol, symbol_length);
    const bool flavour = (ends_with(name, "_ptsz") || ends_with(name, "_ptds")) == per_thread;
    const int score = (named_like ? 2 : 0) + (flavour ? 1 : 0);
    if (score > best_score) {
      best = &kCudaInterposed[i];
      best_score = score;
    }
  }
  return best ? best->wrapper : nullptr;
}

template <typename Call>
CUresult proc_address(const char* symbol, void** pfn, cuuint64_t flags, Call&& real_call) {
  const CUresult result = real_call();
  if (result != CUDA_SUCCESS || shim_disabled() || !pfn || !*pfn) return result;
  if (void* wrapper = wrapper_for_real_entry(*pfn, symbol, flags)) {
    *pfn = wrapper;
  } else if (symbol && find_interposed_cuda(symbol)) {
    QUANTA_LOG_WARN(
        "cuGetProcAddress(\"%s\") returned an entry that is no exported variant the shim wraps; "
        "passing it through",
        symbol);
  }
  return result;
}

thread_local bool t_resolving = false;

}  // namespace

namespace quanta::shim {

const Interposed* find_interposed_cuda(const char* name) noexcept {
  if (!name || name[0] != 'c' || name[1] != 'u') return nullptr;
  for (const Interposed& entry : kCudaInterposed)
    if (!strcmp(entry.name, name)) return &entry;
  return nullptr;
}

bool shim_disabled() noexcept {
  return options().disabled;
}

CUresult driver_entry_missing(const char* name) noexcept {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true))
    QUANTA_LOG_ERROR("the real CUDA driver does not provide %s (is libcuda.so.1 installed?)", name);
  else
    QUANTA_LOG_DEBUG("the real CUDA driver does not provide %s", name);
  return CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace quanta::shim

QUANTA_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                                cuuint64_t flags) {
  auto real = QUANTA_REAL(cuGetProcAddress);
  if (!real) return driver_entry_missing("cuGetProcAddress");
  return proc_address(symbol, pfn, flags, [&] { return real(symbol, pfn, cudaVersion, flags); });
}

QUANTA_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                   cuuint64_t flags,
                                                   CUdriverProcAddressQueryResult* symbolStatus) {
  auto real = QUANTA_REAL(cuGetProcAddress_v2);
  if (!real) return driver_entry_missing("cuGetProcAddress_v2");
  return proc_address(symbol, pfn, flags,
                      [&] { return real(symbol, pfn, cudaVersion, flags, symbolStatus); });
}

// ---- dlsym ------------------------------------------------------------------------------

// glibc's dlsym, where the trampoline jumps when the shim has nothing to say.
extern "C" {
__attribute__((visibility("hidden"))) void* quanta_dlsym_next = nullptr;
}

// Decides one dlsym call. Returns the wrapper to answer with, or nullptr to let glibc
// answer (the trampoline then jumps to quanta_dlsym_next with the original arguments).
extern "C" __attribute__((visibility("hidden"))) void* quanta_dlsym_decide(void* handle,
                                                                           const char* name,
                                                                           const void* caller) {
  if (!quanta_dlsym_next) quanta_dlsym_next = real_dlsym_function();
  if (t_resolving || !name || handle == RTLD_DEFAULT || handle == RTLD_NEXT || shim_disabled())
    return nullptr;
  const bool is_cuda = name[0] == 'c' && name[1] == 'u';
  const Interposed* entry = is_cuda ? find_interposed_cuda(name) : find_interposed_nvml(name);
  if (!entry) return nullptr;
  t_resolving = true;  // dladdr/dlopen below must not come back here
  void* answer = nullptr;
  const ObjectKind asking = object_of(caller);
  if (asking != ObjectKind::cuda_driver && asking != ObjectKind::nvml &&
      asking != ObjectKind::shim) {
    void* found = real_dlsym(handle, name);
    const ObjectKind owner = found ? object_of(found) : ObjectKind::other;
    if ((is_cuda && owner == ObjectKind::cuda_driver) || (!is_cuda && owner == ObjectKind::nvml))
      answer = entry->wrapper;
  }
  t_resolving = false;
  return answer;
}

#if defined(__x86_64__)
__asm__(R"(
    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
    endbr64
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    movq 16(%rsp), %rdx
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call quanta_dlsym_decide
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 1f
    ret
1:
    jmp *quanta_dlsym_next(%rip)
    .cfi_endproc
    .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
__asm__(R"(
    .text
    .globl dlsym
    .type dlsym, %function
    .p2align 4
dlsym:
    .cfi_startproc
    stp x29, x30, [sp, #-32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov x29, sp
    stp x0, x1, [sp, #16]
    mov x2, x30
    bl quanta_dlsym_decide
    cbnz x0, 1f
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #32
    .cfi_def_cfa_offset 0
    adrp x16, quanta_dlsym_next
    ldr x16, [x16, :lo12:quanta_dlsym_next]
    br x16
1:
    ldp x29, x30, [sp], #32
    ret
    .cfi_endproc
    .size dlsym, .-dlsym
)");
#endif
