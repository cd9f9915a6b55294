// The register-keeping call both the loader's stubs (`resolve_common`) and the core's gate stubs
// (`gate::slow_path`) make: included by both crates (`include!`), which share no dependency.
//
// `call_keeping_args!(f)` expands to the body of a naked function reached by a jump from a stub
// that left an index in r11 (x86-64) or x17 (aarch64): it saves every argument register, calls
// `f(index) -> *mut ()`, restores the registers and jumps to what `f` returned, so the caller's
// frame and return address are as the caller left them, whatever the prototype (variadic ones
// included: %al is kept).

#[cfg(target_arch = "x86_64")]
macro_rules! call_keeping_args {
    ($f:path) => {
        core::arch::naked_asm!(
            "push rbp",
            "mov rbp, rsp",
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "push rax",
            "push r11",
            "sub rsp, 128",
            "movdqu [rsp], xmm0",
            "movdqu [rsp + 16], xmm1",
            "movdqu [rsp + 32], xmm2",
            "movdqu [rsp + 48], xmm3",
            "movdqu [rsp + 64], xmm4",
            "movdqu [rsp + 80], xmm5",
            "movdqu [rsp + 96], xmm6",
            "movdqu [rsp + 112], xmm7",
            "mov edi, r11d",
            "call {f}",
            "mov r11, rax",
            "movdqu xmm0, [rsp]",
            "movdqu xmm1, [rsp + 16]",
            "movdqu xmm2, [rsp + 32]",
            "movdqu xmm3, [rsp + 48]",
            "movdqu xmm4, [rsp + 64]",
            "movdqu xmm5, [rsp + 80]",
            "movdqu xmm6, [rsp + 96]",
            "movdqu xmm7, [rsp + 112]",
            "add rsp, 128",
            "pop r10",
            "pop rax",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "pop rbp",
            "jmp r11",
            f = sym $f,
        )
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! call_keeping_args {
    ($f:path) => {
        core::arch::naked_asm!(
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "stp x0, x1, [sp, #-16]!",
            "stp x2, x3, [sp, #-16]!",
            "stp x4, x5, [sp, #-16]!",
            "stp x6, x7, [sp, #-16]!",
            "stp x8, x17, [sp, #-16]!",
            "stp q0, q1, [sp, #-32]!",
            "stp q2, q3, [sp, #-32]!",
            "stp q4, q5, [sp, #-32]!",
            "stp q6, q7, [sp, #-32]!",
            "mov w0, w17",
            "bl {f}",
            "mov x16, x0",
            "ldp q6, q7, [sp], #32",
            "ldp q4, q5, [sp], #32",
            "ldp q2, q3, [sp], #32",
            "ldp q0, q1, [sp], #32",
            "ldp x8, x17, [sp], #16",
            "ldp x6, x7, [sp], #16",
            "ldp x4, x5, [sp], #16",
            "ldp x2, x3, [sp], #16",
            "ldp x0, x1, [sp], #16",
            "ldp x29, x30, [sp], #16",
            "br x16",
            f = sym $f,
        )
    };
}
