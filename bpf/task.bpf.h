/* Task helpers the scheduler-tracepoint programs share: the task state across the kernel's
 * rename of `state` to `__state` (5.14), read the CO-RE way. */
#ifndef QUANTA_TASK_BPF_H
#define QUANTA_TASK_BPF_H

#define QUANTA_TASK_RUNNING 0

/* Kernels before 5.14 named the field `state`; CO-RE picks whichever exists. */
struct task_struct___pre514 {
  long state;
} __attribute__((preserve_access_index));

static __always_inline long quanta_task_state(struct task_struct* t) {
  if (bpf_core_field_exists(t->__state)) return BPF_CORE_READ(t, __state);
  return BPF_CORE_READ((struct task_struct___pre514*)t, state);
}

#endif
