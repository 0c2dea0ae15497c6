/*
 * Ember's test guest: entry points and the AP trampoline.
 *
 * The image is linked at 1 MiB. Its first 0x200 bytes are padding so that the 64-bit entry
 * sits at load address + 0x200, where the bzImage variant's boot protocol puts it. Both
 * entries switch to the guest's own GDT and its own identity page tables (4 GiB in 2 MiB
 * pages, built by the assembler), then call guest_main(kind, boot_info).
 */

#define BOOT_PVH 1
#define BOOT_LINUX64 2
#define AP_BASE 0x10000

        .section .head, "ax"
        .code64
        .globl _start
_start:
        jmp linux64_entry
        .org 0x200
linux64_entry:
        cli
        movq %rsi, %rbx
        movl $BOOT_LINUX64, %edi
        jmp common64

        .text
        .code32
        .globl pvh_entry
pvh_entry:
        cli
        movl %cr4, %eax
        orl $0x20, %eax                 /* PAE */
        movl %eax, %cr4
        movl $pml4, %eax
        movl %eax, %cr3
        movl $0xc0000080, %ecx          /* EFER.LME */
        rdmsr
        orl $0x100, %eax
        wrmsr
        movl %cr0, %eax
        orl $0x80000001, %eax           /* PG | PE */
        movl %eax, %cr0
        lgdt gdt64_desc
        movl $BOOT_PVH, %edi
        ljmp $0x08, $pvh_long

        .code64
pvh_long:
        movl %ebx, %ebx                 /* zero-extend the start_info pointer */
common64:
        lgdt gdt64_desc
        movq $pml4, %rax
        movq %rax, %cr3
        movw $0x10, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        movw %ax, %fs
        movw %ax, %gs
        leaq stack_top(%rip), %rsp
        pushq $0x08
        leaq 1f(%rip), %rax
        pushq %rax
        lretq
1:      movq %rbx, %rsi
        call guest_main
2:      hlt
        jmp 2b

/* Copied to AP_BASE; each AP enters it in real mode at AP_BASE:0 after INIT/SIPI. */
        .code16
        .globl ap_trampoline, ap_trampoline_end
ap_trampoline:
        cli
        movw %cs, %ax
        movw %ax, %ds
        lgdtl ap_gdt_desc - ap_trampoline
        movl %cr0, %eax
        orl $1, %eax
        movl %eax, %cr0
        ljmpl $0x18, $(AP_BASE + ap_protected - ap_trampoline)
        .code32
ap_protected:
        movw $0x10, %ax
        movw %ax, %ds
        lock incl ap_count
3:      hlt
        jmp 3b
/* The GDT every CPU uses; it lies below 4 GiB, where a real-mode lgdtl reaches. */
ap_gdt_desc:
        .word gdt_end - gdt - 1
        .long gdt
ap_trampoline_end:

        .data
        .balign 8
gdt:
        .quad 0
        .quad 0x00af9a000000ffff        /* 0x08: 64-bit code */
        .quad 0x00cf92000000ffff        /* 0x10: data */
        .quad 0x00cf9a000000ffff        /* 0x18: 32-bit code, for the APs' way up */
gdt_end:
gdt64_desc:
        .word gdt_end - gdt - 1
        .quad gdt

        .globl ap_count
        .balign 4
ap_count:
        .long 0

        .balign 4096
pml4:
        .quad pdpt + 3
        .fill 511, 8, 0
pdpt:
        .quad pd + 0x0003
        .quad pd + 0x1003
        .quad pd + 0x2003
        .quad pd + 0x3003
        .fill 508, 8, 0
pd:
        .set page, 0
        .rept 2048
        .quad (page << 21) | 0x83
        .set page, page + 1
        .endr

        .bss
        .balign 16
        .skip 65536
stack_top:

#ifdef PVH_NOTE
/* XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit PVH entry point. */
        .section .note.pvh, "a"
        .balign 4
        .long 4                         /* name size */
        .long 4                         /* descriptor size */
        .long 18                        /* type */
        .asciz "Xen"
        .long pvh_entry
#endif
