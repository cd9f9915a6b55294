/* The dlsym override's entry (AArch64 AAPCS64). See dlsym_x86_64.S for why it exists: forward
 * lookups cuslice does not answer to the real dlsym with the caller's link register intact, so
 * RTLD_NEXT stays relative to the caller. Assembled for aarch64 builds only; the x86_64 tests
 * do not exercise it.
 */
    .text
    .globl  cuslice_dlsym_trampoline
    .hidden cuslice_dlsym_trampoline
    .type   cuslice_dlsym_trampoline, %function
cuslice_dlsym_trampoline:
    .cfi_startproc
    stp     x29, x30, [sp, #-32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov     x29, sp
    stp     x0, x1, [sp, #16]
    bl      cuslice_dlsym_route
    mov     x16, x0
    ldp     x0, x1, [sp, #16]
    ldp     x29, x30, [sp], #32
    .cfi_def_cfa_offset 0
    .cfi_restore 29
    .cfi_restore 30
    cbz     x16, 1f
    mov     x0, x16
    ret
1:
    adrp    x16, cuslice_real_dlsym
    ldr     x16, [x16, :lo12:cuslice_real_dlsym]
    br      x16
    .cfi_endproc
    .size   cuslice_dlsym_trampoline, .-cuslice_dlsym_trampoline

    .bss
    .globl  cuslice_real_dlsym
    .hidden cuslice_real_dlsym
    .align  3
    .type   cuslice_real_dlsym, %object
    .size   cuslice_real_dlsym, 8
cuslice_real_dlsym:
    .zero   8

    .section .note.GNU-stack,"",%progbits
