/* The dlsym override's entry (x86_64 SysV).
 *
 * glibc resolves dlsym(RTLD_NEXT, ...) relative to the object that called dlsym, found from the
 * return address. An override that forwarded with an ordinary call would make every library's
 * RTLD_NEXT lookup relative to libcuslice.so instead. So this entry asks cuslice_dlsym_route
 * (Rust) whether the lookup is one cuslice answers; if not (route returns NULL), it restores the
 * arguments and stack exactly as the caller left them and tail-jumps into the real dlsym, which
 * then sees the caller's own return address.
 */
    .text
    .globl  cuslice_dlsym_trampoline
    .hidden cuslice_dlsym_trampoline
    .type   cuslice_dlsym_trampoline, @function
cuslice_dlsym_trampoline:
    .cfi_startproc
    push    %rdi
    .cfi_adjust_cfa_offset 8
    push    %rsi
    .cfi_adjust_cfa_offset 8
    sub     $8, %rsp                    /* 16-byte alignment for the call */
    .cfi_adjust_cfa_offset 8
    call    cuslice_dlsym_route@PLT     /* (handle, name) still in rdi, rsi */
    add     $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop     %rsi
    .cfi_adjust_cfa_offset -8
    pop     %rdi
    .cfi_adjust_cfa_offset -8
    test    %rax, %rax
    jz      1f
    ret                                 /* cuslice's wrapper */
1:
    jmp     *cuslice_real_dlsym(%rip)   /* route set it before returning NULL */
    .cfi_endproc
    .size   cuslice_dlsym_trampoline, .-cuslice_dlsym_trampoline

    .bss
    .globl  cuslice_real_dlsym
    .hidden cuslice_real_dlsym
    .align  8
    .type   cuslice_real_dlsym, @object
    .size   cuslice_real_dlsym, 8
cuslice_real_dlsym:
    .zero   8

    .section .note.GNU-stack,"",@progbits
