/*
 * Ember's test guest. It reports, one line per check on COM1, what the VMM gave it: how it
 * was booted, the command line, the e820 map, the initrd, the CPUs in the MP table and how
 * many came up after INIT/SIPI, what the ACPI tables describe, and what its own virtio-blk
 * driver sees on every disk the command line lists. Then it resets through the i8042. Tests
 * read these lines.
 *
 * Command-line words it understands:
 *   quick       print only "guest: hello" and reset (the start-up benchmark)
 *   nosmp       do not start the APs
 *   hang        never reset (for signal tests)
 *   boottimer   write 123 to Firecracker's boot timer at the first MMIO window when done
 *   poweroff    power off through the ACPI sleep control register instead of resetting
 *   cpuid       print what CPUID returns for leaves the VMM rewrites (1, 0xa, 0x4000000[01])
 *   keyboard    before "done", print each byte the i8042 keyboard sends until Ctrl+Alt+Del
 *               has been pressed and released (the API's SendCtrlAltDel)
 *   ticks       after "done", print "tick N" every 10^8 TSC cycles, forever (for pausing)
 *   echo        after "done", print "ready", then answer each line typed on COM1 with
 *               "echo LINE", forever (a request a restored guest answers)
 *   disklog     with ticks: before printing tick N, write the 512-byte record "TICK" + N
 *               (little-endian u64) to sector N % 64 of the first disk; a failed write
 *               prints "tick N disk status=S" instead (for snapshots: the queue goes on)
 */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;

#define BOOT_PVH 1
#define BOOT_LINUX64 2
#define AP_BASE 0x10000UL
#define LAPIC 0xfee00000UL

extern volatile u32 ap_count;
extern u8 ap_trampoline[], ap_trampoline_end[];

void *memset(void *d, int c, u64 n) { u8 *p = d; while (n--) *p++ = (u8)c; return d; }
void *memcpy(void *d, const void *s, u64 n) { u8 *p = d; const u8 *q = s; while (n--) *p++ = *q++; return d; }
int memcmp(const void *a, const void *b, u64 n) {
    const u8 *p = a, *q = b;
    for (; n; n--, p++, q++) if (*p != *q) return *p - *q;
    return 0;
}

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" :: "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u64 rdtsc(void) { u32 lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((u64)hi << 32) | lo; }
static inline void barrier(void) { __asm__ volatile("mfence" ::: "memory"); }
static inline void pause(void) { __asm__ volatile("pause" ::: "memory"); }
static inline u32 rd32(u64 a) { return *(volatile u32 *)a; }
static inline void wr32(u64 a, u32 v) { *(volatile u32 *)a = v; }
static inline u64 rd64(u64 a) { return *(volatile u64 *)a; }

/* The emulated UART is always ready to send, so no LSR polling. */
static void putc(char c) { outb(0x3f8, (u8)c); }
static void puts(const char *s) { while (*s) putc(*s++); }
static void puthex(u64 v) {
    char b[19]; int i = 18; b[i] = 0;
    do { b[--i] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    b[--i] = 'x'; b[--i] = '0';
    puts(&b[i]);
}
static void putdec(u64 v) {
    char b[21]; int i = 20; b[i] = 0;
    do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    puts(&b[i]);
}
static void line(const char *s) { puts("guest: "); puts(s); }
static void end(void) { putc('\n'); }

static u32 fnv1a(const u8 *p, u64 n) {
    u32 h = 2166136261u;
    while (n--) { h ^= *p++; h *= 16777619u; }
    return h;
}

static u64 strlen(const char *s) { u64 n = 0; while (s[n]) n++; return n; }

/* True if the command line contains `word` as a whole word. */
static const char *cmdline = "";
static int has_word(const char *word) {
    u64 n = strlen(word);
    for (const char *p = cmdline; *p; p++) {
        if ((p == cmdline || p[-1] == ' ') && !memcmp(p, word, n) && (p[n] == 0 || p[n] == ' ' || p[n] == '='))
            return 1;
    }
    return 0;
}

static __attribute__((noreturn)) void reset(void) {
    if (has_word("hang")) {
        line("hanging"); end();
        for (;;) __asm__ volatile("hlt");
    }
    outb(0x64, 0xfe);
    for (;;) __asm__ volatile("hlt");
}

/* ---- Boot information ---------------------------------------------------------------- */

static void report_e820_entry(u64 addr, u64 size, u32 type, u64 *ram, u64 *top) {
    line("e820 addr="); puthex(addr); puts(" size="); puthex(size); puts(" type="); putdec(type); end();
    if (type == 1) { *ram += size; if (addr + size > *top) *top = addr + size; }
}

static void report_initrd(u64 addr, u64 size) {
    if (!size) { line("initrd none"); end(); return; }
    line("initrd addr="); puthex(addr); puts(" size="); putdec(size);
    puts(" fnv="); puthex(fnv1a((const u8 *)addr, size)); end();
}

static void read_boot_info(int kind, u64 info) {
    u64 ram = 0, top = 0;
    if (kind == BOOT_PVH) {
        line("boot=pvh magic="); puthex(rd32(info)); end();
        cmdline = (const char *)rd64(info + 24);
        u64 map = rd64(info + 40);
        u32 entries = rd32(info + 48);
        for (u32 i = 0; i < entries; i++)
            report_e820_entry(rd64(map + 24 * i), rd64(map + 24 * i + 8), rd32(map + 24 * i + 16), &ram, &top);
        u32 modules = rd32(info + 12);
        u64 modlist = rd64(info + 16);
        if (modules) report_initrd(rd64(modlist), rd64(modlist + 8));
        else report_initrd(0, 0);
    } else {
        u8 *zp = (u8 *)info;
        line("boot=linux64 setup_version="); puthex(*(u16 *)(zp + 0x206));
        puts(" loader="); puthex(zp[0x210]); end();
        cmdline = (const char *)(u64)*(u32 *)(zp + 0x228);
        u8 entries = zp[0x1e8];
        for (u32 i = 0; i < entries; i++) {
            u8 *e = zp + 0x2d0 + 20 * i;
            report_e820_entry(*(u64 *)e, *(u64 *)(e + 8), *(u32 *)(e + 16), &ram, &top);
        }
        u64 addr = *(u32 *)(zp + 0x218) | ((u64)*(u32 *)(zp + 0xc0) << 32);
        u64 size = *(u32 *)(zp + 0x21c) | ((u64)*(u32 *)(zp + 0xc4) << 32);
        report_initrd(addr, size);
    }
    line("ram_bytes="); puthex(ram); puts(" ram_top="); puthex(top); end();
    line("cmdline="); puts(cmdline); end();
}

/* ---- CPUs: MP table and INIT/SIPI ------------------------------------------------------ */

static u8 sum(const u8 *p, u64 n) { u8 s = 0; while (n--) s += *p++; return s; }

/* The first 16-byte-aligned structure in [start, end) that begins with `sig` and whose first
 * `summed` bytes sum to zero: the MP floating pointer, the ACPI root pointer. */
static const u8 *find_signed(u64 start, u64 end, const char *sig, u64 summed) {
    for (u64 a = start; a + summed <= end; a += 16) {
        const u8 *p = (const u8 *)a;
        if (!memcmp(p, sig, strlen(sig)) && sum(p, summed) == 0) return p;
    }
    return 0;
}

static u32 cpu_ids[64];

static u32 read_mptable(void) {
    const u8 *fp = find_signed(0x9fc00, 0xa0000, "_MP_", 16);
    if (!fp) fp = find_signed(0xf0000, 0x100000, "_MP_", 16);
    if (!fp) { line("mptable missing"); end(); return 0; }
    const u8 *t = (const u8 *)(u64)*(const u32 *)(fp + 4);
    u16 len = *(const u16 *)(t + 4);
    if (memcmp(t, "PCMP", 4) || sum(t, len)) { line("mptable bad-checksum"); end(); return 0; }
    u16 count = *(const u16 *)(t + 34);
    const u8 *e = t + 44;
    u32 cpus = 0;
    for (u16 i = 0; i < count && e < t + len; i++) {
        if (e[0] == 0) {
            if ((e[3] & 1) && cpus < 64) cpu_ids[cpus++] = e[1];
            e += 20;
        } else {
            e += 8;
        }
    }
    line("mptable cpus="); putdec(cpus); puts(" checksum=ok"); end();
    return cpus;
}

/* ---- ACPI: RSDP -> XSDT -> FADT (-> DSDT), MADT --------------------------------------- */

static u64 acpi_sleep_port;
static u8 acpi_s5_type = 0xff;

/* The table at `addr`, if its checksum holds; counts the bad ones in `bad`. */
static const u8 *acpi_table(u64 addr, u32 *bad) {
    const u8 *t = (const u8 *)addr;
    if (!addr || sum(t, rd32(addr + 4))) { (*bad)++; return 0; }
    return t;
}

/* The DSDT's virtio-mmio devices (their _HID strings) and the \_S5_ sleep type. */
static u32 read_dsdt(const u8 *d) {
    u32 len = *(const u32 *)(d + 4), virtio = 0;
    for (u32 i = 36; i + 9 <= len; i++) {
        if (!memcmp(d + i, "LNRO0005", 9)) virtio++;
        /* Name(\_S5_, Package() { BytePrefix 5, ... }) */
        if (!memcmp(d + i, "\\_S5_\x12", 6) && i + 10 <= len && d[i + 8] == 0x0a) acpi_s5_type = d[i + 9];
    }
    return virtio;
}

static void read_acpi(int kind, u64 info) {
    u64 given = kind == BOOT_PVH ? rd64(info + 32) : rd64(info + 0x70);
    const u8 *rsdp = find_signed(0xe0000, 0x100000, "RSD PTR ", 20);
    if (!rsdp) { line("acpi missing"); end(); return; }
    u32 bad = sum(rsdp, 36) != 0;
    const u8 *xsdt = acpi_table(rd64((u64)rsdp + 24), &bad);
    line("acpi rsdp="); puthex((u64)rsdp); puts(given == (u64)rsdp ? " boot-info=same" : " boot-info=other");
    if (!xsdt) { puts(" xsdt=bad"); end(); return; }
    puts(" tables=");
    u32 n = (*(const u32 *)(xsdt + 4) - 36) / 8, cpus = 0, virtio = 0, hw_reduced = 0;
    for (u32 i = 0; i < n; i++) {
        const u8 *t = acpi_table(rd64((u64)xsdt + 36 + 8 * i), &bad);
        if (!t) continue;
        if (i) putc(',');
        for (int c = 0; c < 4; c++) putc((char)t[c]);
        if (!memcmp(t, "FACP", 4)) {
            hw_reduced = (rd32((u64)t + 112) >> 20) & 1;
            acpi_sleep_port = t[244] == 1 ? rd64((u64)t + 248) : 0;
            const u8 *dsdt = acpi_table(rd64((u64)t + 140), &bad);
            if (dsdt) { puts(",DSDT"); virtio = read_dsdt(dsdt); }
        }
        if (!memcmp(t, "APIC", 4)) {
            for (u32 o = 44; o + 2 <= *(const u32 *)(t + 4) && t[o + 1]; o += t[o + 1])
                if (t[o] == 0 && (rd32((u64)t + o + 4) & 1)) cpus++;
        }
    }
    puts(" bad-checksums="); putdec(bad); puts(" cpus="); putdec(cpus); puts(" virtio-mmio="); putdec(virtio);
    puts(" hw-reduced="); putdec(hw_reduced); puts(" sleep-port="); puthex(acpi_sleep_port);
    puts(" s5="); putdec(acpi_s5_type); end();
}

/* Powers off as an ACPI kernel does: SLP_EN with the \_S5_ sleep type to the sleep control
 * port. Then it waits: only the VMM can end it now. */
static __attribute__((noreturn)) void acpi_power_off(void) {
    line("acpi power-off"); end();
    if (acpi_sleep_port && acpi_s5_type != 0xff) outb((u16)acpi_sleep_port, (u8)((acpi_s5_type << 2) | (1 << 5)));
    for (;;) pause();
}

static void spin(u64 n) { while (n--) pause(); }

static void start_aps(u32 cpus) {
    memcpy((void *)AP_BASE, ap_trampoline, (u64)(ap_trampoline_end - ap_trampoline));
    barrier();
    wr32(LAPIC + 0xf0, rd32(LAPIC + 0xf0) | 0x100);     /* software-enable the local APIC */
    u32 self = rd32(LAPIC + 0x20) >> 24;
    for (u32 i = 0; i < cpus; i++) {
        if (cpu_ids[i] == self) continue;
        wr32(LAPIC + 0x310, cpu_ids[i] << 24);
        wr32(LAPIC + 0x300, 0x4500);                    /* INIT */
        spin(10000);
        for (int k = 0; k < 2; k++) {
            wr32(LAPIC + 0x310, cpu_ids[i] << 24);
            wr32(LAPIC + 0x300, 0x4600 | (AP_BASE >> 12)); /* STARTUP */
            spin(2000);
        }
    }
    for (u64 t = 0; t < 400000000UL && ap_count + 1 < cpus; t++) pause();
    line("smp online="); putdec(ap_count + 1); end();
}

/* ---- virtio-mmio block driver ---------------------------------------------------------- */

#define QSZ 8
#define VIRTQ_DESC_F_NEXT 1
#define VIRTQ_DESC_F_WRITE 2

struct desc { u64 addr; u32 len; u16 flags; u16 next; };
struct vq {
    struct desc d[QSZ];
    u16 avail_flags, avail_idx, avail_ring[QSZ], used_event;
    u8 pad[4096 - 16 * QSZ - 6 - 2 * QSZ];
    u16 used_flags;
    volatile u16 used_idx;
    struct { u32 id, len; } used_ring[QSZ];
    u16 avail_event;
} __attribute__((aligned(4096)));

struct blk {
    u64 base;
    u64 sectors;
    u64 features;
    u16 last_used;
    struct vq q;
};

static struct blk disks[8];
static u8 header[16] __attribute__((aligned(16)));
static u8 buf[4096] __attribute__((aligned(4096)));
static u8 disk0_head[4096];
static volatile u8 status;

enum { T_IN = 0, T_OUT = 1, T_FLUSH = 4, T_GET_ID = 8 };

static int blk_init(struct blk *b) {
    u64 base = b->base;
    if (rd32(base) != 0x74726976 || rd32(base + 4) != 2 || rd32(base + 8) != 2) return 0;
    wr32(base + 0x70, 0);
    wr32(base + 0x70, 1);
    wr32(base + 0x70, 1 | 2);
    wr32(base + 0x14, 0); u64 f = rd32(base + 0x10);
    wr32(base + 0x14, 1); f |= (u64)rd32(base + 0x10) << 32;
    b->features = f;
    u64 want = f & ((1UL << 32) | (1UL << 5) | (1UL << 9));   /* VERSION_1, RO, FLUSH */
    wr32(base + 0x24, 0); wr32(base + 0x20, (u32)want);
    wr32(base + 0x24, 1); wr32(base + 0x20, (u32)(want >> 32));
    wr32(base + 0x70, 1 | 2 | 8);
    if (!(rd32(base + 0x70) & 8)) return 0;
    wr32(base + 0x30, 0);
    if (rd32(base + 0x34) < QSZ) return 0;
    wr32(base + 0x38, QSZ);
    u64 d = (u64)&b->q.d, a = (u64)&b->q.avail_flags, u = (u64)&b->q.used_flags;
    wr32(base + 0x80, (u32)d); wr32(base + 0x84, (u32)(d >> 32));
    wr32(base + 0x90, (u32)a); wr32(base + 0x94, (u32)(a >> 32));
    wr32(base + 0xa0, (u32)u); wr32(base + 0xa4, (u32)(u >> 32));
    wr32(base + 0x44, 1);
    wr32(base + 0x70, 1 | 2 | 8 | 4);
    b->sectors = rd32(base + 0x100) | ((u64)rd32(base + 0x104) << 32);
    return (rd32(base + 0x70) & 0x40) == 0;
}

/* Submits one request and polls for its completion. Returns the status byte (0xff if the
 * device never wrote it) and the used length through *used_len. */
static u32 blk_request(struct blk *b, u32 type, u64 sector, u64 data, u32 len, int dev_writes, u32 *used_len) {
    *(u32 *)header = type;
    *(u32 *)(header + 4) = 0;
    *(u64 *)(header + 8) = sector;
    status = 0xff;
    struct desc *d = b->q.d;
    d[0] = (struct desc){ (u64)header, 16, VIRTQ_DESC_F_NEXT, 1 };
    int n = 1;
    if (len) {
        d[1] = (struct desc){ data, len, (u16)(VIRTQ_DESC_F_NEXT | (dev_writes ? VIRTQ_DESC_F_WRITE : 0)), 2 };
        n = 2;
    }
    d[n - 1].next = (u16)n;
    d[n] = (struct desc){ (u64)&status, 1, VIRTQ_DESC_F_WRITE, 0 };
    b->q.avail_ring[b->q.avail_idx % QSZ] = 0;
    barrier();
    b->q.avail_idx++;
    barrier();
    wr32(b->base + 0x50, 0);
    for (u64 t = 0; t < 200000000UL && b->q.used_idx == b->last_used; t++) pause();
    barrier();
    if (b->q.used_idx == b->last_used) { *used_len = 0xffffffff; return 0x100; }
    *used_len = b->q.used_ring[b->last_used % QSZ].len;
    b->last_used++;
    wr32(b->base + 0x64, rd32(b->base + 0x60));   /* acknowledge the interrupt */
    return status;
}

static void blk_line(int i, const char *what) { line("blk"); putdec((u64)i); putc(' '); puts(what); }

static void blk_checks(int i, struct blk *b) {
    u32 used, st;
    char id[21];
    memset(buf, 0, sizeof buf);
    st = blk_request(b, T_GET_ID, 0, (u64)buf, 20, 1, &used);
    memcpy(id, buf, 20); id[20] = 0;
    blk_line(i, "id="); puts(id); puts(" sectors="); putdec(b->sectors);
    puts(" ro="); putdec((b->features >> 5) & 1); puts(" flush="); putdec((b->features >> 9) & 1);
    puts(" id_status="); putdec(st); end();

    st = blk_request(b, T_IN, 0, (u64)buf, 4096, 1, &used);
    blk_line(i, "read status="); putdec(st); puts(" used="); putdec(used);
    puts(" fnv="); puthex(fnv1a(buf, 4096)); end();
    if (i == 0) memcpy(disk0_head, buf, 4096);

    if (i > 0) {
        /* Copy the first 4 KiB of disk 0 to the start of this disk, then read it back. */
        memcpy(buf, disk0_head, 4096);
        st = blk_request(b, T_OUT, 0, (u64)buf, 4096, 0, &used);
        blk_line(i, "write status="); putdec(st); end();
        memset(buf, 0, sizeof buf);
        blk_request(b, T_IN, 0, (u64)buf, 4096, 1, &used);
        blk_line(i, "readback match="); putdec(memcmp(buf, disk0_head, 4096) == 0); end();
    }
    st = blk_request(b, T_FLUSH, 0, 0, 0, 0, &used);
    blk_line(i, "flush status="); putdec(st); end();
    st = blk_request(b, T_IN, b->sectors, (u64)buf, 512, 1, &used);
    blk_line(i, "pastend status="); putdec(st); end();
    st = blk_request(b, T_IN, b->sectors - 1, (u64)buf, 4096, 1, &used);
    blk_line(i, "straddle status="); putdec(st); end();
    st = blk_request(b, 99, 0, 0, 0, 0, &used);
    blk_line(i, "badtype status="); putdec(st); end();
    /* A data buffer far outside guest memory: the device must refuse the chain untouched. */
    st = blk_request(b, T_IN, 0, 0x7fff00000000UL, 4096, 1, &used);
    blk_line(i, "wild status="); puthex(st); puts(" used="); putdec(used); end();
}


/* ---- virtio-mmio vsock: a hostile driver ------------------------------------------------ */

/* Sends what a broken or malicious driver would (cut headers, lengths past the chain, wrong
 * CIDs, unknown ops and types, device-writable and wild buffers, looping chains), then a
 * well-formed connection to host port 1234 that carries one message. */

static struct vq vs_q[3];
static u16 vs_tx_n, vs_rx_seen;
static u8 vs_rxbuf[QSZ][512] __attribute__((aligned(16)));
static u8 vs_hdr[64] __attribute__((aligned(16)));
static const char vs_msg[] = "hello from the test guest";

static int vs_init(u64 base) {
    wr32(base + 0x70, 0);
    wr32(base + 0x70, 1);
    wr32(base + 0x70, 1 | 2);
    wr32(base + 0x24, 1); wr32(base + 0x20, 1);   /* VERSION_1 */
    wr32(base + 0x24, 0); wr32(base + 0x20, 0);
    wr32(base + 0x70, 1 | 2 | 8);
    if (!(rd32(base + 0x70) & 8)) return 0;
    for (u32 q = 0; q < 3; q++) {
        wr32(base + 0x30, q);
        if (rd32(base + 0x34) < QSZ) return 0;
        wr32(base + 0x38, QSZ);
        u64 d = (u64)&vs_q[q].d, a = (u64)&vs_q[q].avail_flags, u = (u64)&vs_q[q].used_flags;
        wr32(base + 0x80, (u32)d); wr32(base + 0x84, (u32)(d >> 32));
        wr32(base + 0x90, (u32)a); wr32(base + 0x94, (u32)(a >> 32));
        wr32(base + 0xa0, (u32)u); wr32(base + 0xa4, (u32)(u >> 32));
        wr32(base + 0x44, 1);
    }
    wr32(base + 0x70, 1 | 2 | 8 | 4);
    return (rd32(base + 0x70) & 0x40) == 0;
}

static void vs_header(u64 src_cid, u64 dst_cid, u32 len, u16 type, u16 op, u32 sport) {
    memset(vs_hdr, 0, sizeof vs_hdr);
    *(u64 *)vs_hdr = src_cid;
    *(u64 *)(vs_hdr + 8) = dst_cid;
    *(u32 *)(vs_hdr + 16) = sport;
    *(u32 *)(vs_hdr + 20) = 1234;
    *(u32 *)(vs_hdr + 24) = len;
    *(u16 *)(vs_hdr + 28) = type;
    *(u16 *)(vs_hdr + 30) = op;
    *(u32 *)(vs_hdr + 36) = 65536;   /* buf_alloc */
}

/* Posts one TX chain (descriptors as given, `next` included) and waits for the device. */
static int vs_send(u64 base, const struct desc *chain, int n) {
    struct vq *q = &vs_q[1];
    for (int i = 0; i < n; i++) q->d[i] = chain[i];
    q->avail_ring[vs_tx_n % QSZ] = 0;
    barrier();
    q->avail_idx = ++vs_tx_n;
    barrier();
    wr32(base + 0x50, 1);
    for (u64 t = 0; t < 200000000UL && q->used_idx != vs_tx_n; t++) pause();
    return q->used_idx == vs_tx_n;
}

static int vs_send_header(u64 base, u32 hdr_len) {
    struct desc d = { (u64)vs_hdr, hdr_len, 0, 0 };
    return vs_send(base, &d, 1);
}

static void vsock_checks(u64 base) {
    if (!vs_init(base)) { line("vsock init failed"); end(); return; }
    u64 cid = rd32(base + 0x100) | ((u64)rd32(base + 0x104) << 32);
    line("vsock cid="); putdec(cid); end();
    for (int i = 0; i < QSZ; i++) {
        vs_q[0].d[i] = (struct desc){ (u64)vs_rxbuf[i], sizeof vs_rxbuf[i], VIRTQ_DESC_F_WRITE, 0 };
        vs_q[0].avail_ring[i] = (u16)i;
    }
    barrier();
    vs_q[0].avail_idx = QSZ;
    barrier();
    wr32(base + 0x50, 0);

    int done = 0;
    vs_header(cid, 2, 0, 1, 1, 4000);
    done += vs_send_header(base, 20);                          /* a header cut short */
    vs_header(cid, 2, 100, 1, 5, 4000);
    struct desc two[2] = { { (u64)vs_hdr, 44, VIRTQ_DESC_F_NEXT, 1 }, { (u64)buf, 10, 0, 0 } };
    done += vs_send(base, two, 2);                             /* a length past the chain */
    vs_header(cid, 2, 0xffffffff, 1, 5, 4000);
    done += vs_send_header(base, 44);                          /* a length past any payload */
    struct desc wo = { (u64)vs_hdr, 44, VIRTQ_DESC_F_WRITE, 0 };
    done += vs_send(base, &wo, 1);                             /* a device-writable buffer */
    struct desc wild = { 0x7fff00000000UL, 44, 0, 0 };
    done += vs_send(base, &wild, 1);                           /* outside guest memory */
    vs_header(77, 2, 0, 1, 1, 4000);
    struct desc loop = { (u64)vs_hdr, 44, VIRTQ_DESC_F_NEXT, 0 };
    done += vs_send(base, &loop, 1);                           /* a chain that loops */
    struct desc past = { (u64)vs_hdr, 44, VIRTQ_DESC_F_NEXT, 200 };
    done += vs_send(base, &past, 1);                           /* a next past the table */
    done += vs_send_header(base, 44);                          /* from another CID */
    vs_header(cid, 4, 0, 1, 1, 4000);
    done += vs_send_header(base, 44);                          /* to another guest */
    vs_header(cid, 2, 0, 2, 1, 4000);
    done += vs_send_header(base, 44);                          /* a seqpacket: RST */
    vs_header(cid, 2, 0, 1, 99, 4000);
    done += vs_send_header(base, 44);                          /* an unknown op: RST */
    vs_header(cid, 2, 0, 1, 5, 4000);
    done += vs_send_header(base, 44);                          /* data for no stream: RST */
    vs_header(cid, 2, 0, 1, 1, 4001);
    done += vs_send_header(base, 44);                          /* a real request */
    line("vsock hostile sent="); putdec((u64)done); end();

    /* Wait (a few seconds at most) for the three RSTs and the RESPONSE. */
    u32 rsts = 0, responses = 0;
    for (u64 until = rdtsc() + 10000000000UL; rdtsc() < until && vs_rx_seen < 4;) {
        if (vs_q[0].used_idx == vs_rx_seen) { pause(); continue; }
        barrier();
        u8 *p = vs_rxbuf[vs_q[0].used_ring[vs_rx_seen % QSZ].id];
        u16 op = *(u16 *)(p + 30);
        if (op == 3) rsts++;
        if (op == 2 && *(u32 *)(p + 20) == 4001) responses++;
        vs_rx_seen++;
    }
    line("vsock rsts="); putdec(rsts); puts(" responses="); putdec(responses); end();
    if (responses) {
        u64 n = sizeof vs_msg - 1;
        memcpy(buf, vs_msg, n);
        vs_header(cid, 2, (u32)n, 1, 5, 4001);
        struct desc rw[2] = { { (u64)vs_hdr, 44, VIRTQ_DESC_F_NEXT, 1 }, { (u64)buf, (u32)n, 0, 0 } };
        line("vsock message sent="); putdec((u64)vs_send(base, rw, 2)); end();
    }
}

static u64 parse_hex(const char **p) {
    u64 v = 0;
    for (;;) {
        char c = **p; u32 d;
        if (c >= '0' && c <= '9') d = (u32)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (u32)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (u32)(c - 'A' + 10);
        else return v;
        v = v * 16 + d; (*p)++;
    }
}

static void virtio_checks(void) {
    const char *key = "virtio_mmio.device=4K@0x";
    u64 n = strlen(key);
    int count = 0;
    for (const char *p = cmdline; *p && count < 8; p++) {
        if (memcmp(p, key, n)) continue;
        const char *q = p + n;
        struct blk *b = &disks[count];
        b->base = parse_hex(&q);
        if (rd32(b->base + 8) == 19) { vsock_checks(b->base); continue; }
        if (!blk_init(b)) { blk_line(count, "init failed"); end(); count++; continue; }
        blk_checks(count, b);
        count++;
    }
    line("disks="); putdec((u64)count); end();
}

static void cpuid(u32 leaf, u32 r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(0));
}

static void report_cpuid(void) {
    u32 leaves[4] = {1, 0xa, 0x40000000, 0x40000001};
    for (int i = 0; i < 4; i++) {
        u32 r[4];
        cpuid(leaves[i], r);
        line("cpuid "); puthex(leaves[i]);
        puts(" eax="); puthex(r[0]); puts(" ebx="); puthex(r[1]);
        puts(" ecx="); puthex(r[2]); puts(" edx="); puthex(r[3]); end();
    }
}

/* ---- Keyboard and clock ------------------------------------------------------------- */

/* Polls the i8042 and prints every byte until Ctrl's release (0x9d in set 1, the last byte
 * of Ctrl+Alt+Del), or 16 bytes. */
static void read_keys(void) {
    line("keyboard waiting"); end();
    for (int n = 0; n < 16;) {
        if (!(inb(0x64) & 1)) { pause(); continue; }
        u8 b = inb(0x60);
        line("key "); puthex(b); end();
        n++;
        if (b == 0x9d) { line("ctrl-alt-del"); end(); return; }
    }
}

/* Progress that stops when the vCPU does: one line per 10^8 TSC cycles. */
static __attribute__((noreturn)) void ticks(void) {
    int disklog = has_word("disklog") && disks[0].base;
    u64 next = rdtsc() + 100000000UL;
    for (u64 n = 0;; n++) {
        while (rdtsc() < next) pause();
        next = rdtsc() + 100000000UL;
        if (disklog) {
            u32 used;
            memset(buf, 0, 512);
            memcpy(buf, "TICK", 4);
            *(u64 *)(buf + 4) = n;
            u32 st = blk_request(&disks[0], T_OUT, n % 64, (u64)buf, 512, 0, &used);
            if (st) { line("tick "); putdec(n); puts(" disk status="); putdec(st); end(); continue; }
        }
        line("tick "); putdec(n); end();
    }
}

/* Answers each line COM1 receives (polling the line status register's data-ready bit). */
static __attribute__((noreturn)) void echo_lines(void) {
    char text[64];
    u32 n = 0;
    line("ready"); end();
    for (;;) {
        if (!(inb(0x3fd) & 1)) { pause(); continue; }
        char ch = (char)inb(0x3f8);
        if (ch == '\r') continue;
        if (ch != '\n' && n < sizeof text - 1) { text[n++] = ch; continue; }
        text[n] = 0;
        line("echo "); puts(text); end();
        n = 0;
    }
}

/* Only the command line, silently: quick mode must print nothing but its one line. */
static void find_cmdline(int kind, u64 info) {
    if (kind == BOOT_PVH) cmdline = (const char *)rd64(info + 24);
    else cmdline = (const char *)(u64)*(u32 *)(info + 0x228);
}

void guest_main(int kind, u64 info) {
    find_cmdline(kind, info);
    if (has_word("quick")) { line("hello"); end(); reset(); }
    read_boot_info(kind, info);
    if (has_word("cpuid")) report_cpuid();
    u32 cpus = read_mptable();
    read_acpi(kind, info);
    if (!has_word("nosmp") && cpus > 1) start_aps(cpus);
    else { line("smp online=1"); end(); }
    virtio_checks();
    if (has_word("keyboard")) read_keys();
    if (has_word("boottimer")) *(volatile u8 *)0xd0000000UL = 123;
    line("done"); end();
    if (has_word("ticks")) ticks();
    if (has_word("echo")) echo_lines();
    if (has_word("poweroff")) acpi_power_off();
    reset();
}
