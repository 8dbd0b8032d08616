// SPDX-License-Identifier: GPL-2.0-or-later
/* mtdwarf: reads what madtrace needs from the DWARF of one ELF file, with
 * elfutils' libdw, and writes it in the compact form binary/dwarf_native.py
 * reads (the symbol cache keeps it per binary):
 *
 *   mtdwarf FILE OUT
 *
 * What is read (the semantics of dwarf_vars.py and dwarf_lines.py):
 * - the global and static variables (DW_TAG_variable with a single DW_OP_addr
 *   location, in compilation units, namespaces, functions, lexical blocks and
 *   inlined subroutines), with their scope, and DW_AT_specification /
 *   DW_AT_abstract_origin followed for a missing name or type;
 * - the types they reach: base, enum, struct/union/class with their members,
 *   pointers, references, typedefs, qualifiers, arrays with their dimensions,
 *   function types; cycles through pointers are kept as indexes;
 * - the line table rows of every compilation unit, end of sequence included.
 *
 * OUT: "MTDW0001", then sections: a 4-byte tag, u64 item count, u64 byte
 * size, the items (little endian, layouts below and in dwarf_native.py).
 * Exit status: 0 written; 1 usage or I/O error; 2 no DWARF.  Corrupt DWARF
 * stops the walk of the unit it is in: what was read is written. */
#include <elfutils/libdw.h>
#include <dwarf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NONE 0xFFFFFFFFu
#define T_VOID (-1)
#define T_UNKNOWN (-2)

enum { K_BASE, K_ENUM, K_STRUCT, K_UNION, K_CLASS, K_POINTER, K_REFERENCE, K_TYPEDEF,
       K_CONST, K_VOLATILE, K_RESTRICT, K_ATOMIC, K_ARRAY, K_FUNCTION, K_UNKNOWN };

typedef struct { uint32_t kind, name; uint64_t size; int64_t target; uint32_t first, n, tag, pad; } type_t;
typedef struct { uint32_t name, pad; uint64_t offset, size; int64_t type; } member_t;
typedef struct { uint32_t name, scope, cu, external; uint64_t address; int64_t type; } var_t;
typedef struct { uint64_t address; int32_t file, line; } line_t;

#define VEC(T) struct { T *v; size_t n, cap; }
#define PUSH(vec, item) do { \
    if ((vec).n == (vec).cap) { \
        (vec).cap = (vec).cap ? (vec).cap * 2 : 256; \
        (vec).v = realloc((vec).v, (vec).cap * sizeof *(vec).v); \
        if (!(vec).v) { perror("mtdwarf"); exit(1); } \
    } \
    (vec).v[(vec).n++] = (item); } while (0)

static VEC(char) strs;
static VEC(type_t) types;
static VEC(member_t) members;
static VEC(int64_t) dims;
static VEC(var_t) vars;
static VEC(line_t) lines;
static VEC(uint32_t) files;

/* ------------------------------------------------------------- hash maps */
typedef struct { uint64_t key; uint64_t value; int used; } slot_t;
typedef struct { slot_t *s; size_t cap, n; } map_t;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static void map_put(map_t *m, uint64_t key, uint64_t value);

static void map_grow(map_t *m) {
    map_t bigger = { calloc(m->cap ? m->cap * 2 : 1024, sizeof(slot_t)), m->cap ? m->cap * 2 : 1024, 0 };
    if (!bigger.s) { perror("mtdwarf"); exit(1); }
    for (size_t i = 0; i < m->cap; i++)
        if (m->s[i].used) map_put(&bigger, m->s[i].key, m->s[i].value);
    free(m->s);
    *m = bigger;
}

static slot_t *map_find(map_t *m, uint64_t key) {
    if (!m->cap) return NULL;
    for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->s[i].used) return NULL;
        if (m->s[i].key == key) return &m->s[i];
    }
}

static void map_put(map_t *m, uint64_t key, uint64_t value) {
    if ((m->n + 1) * 2 > m->cap) map_grow(m);
    size_t i = mix(key) & (m->cap - 1);
    while (m->s[i].used && m->s[i].key != key) i = (i + 1) & (m->cap - 1);
    if (!m->s[i].used) m->n++;
    m->s[i].used = 1;
    m->s[i].key = key;
    m->s[i].value = value;
}

static map_t type_index;   /* DIE offset -> type index */
static map_t string_index; /* string hash -> offset in strs (collisions checked) */
static map_t var_seen;     /* hash(name, address) -> index in vars */

static uint64_t hash_bytes(const char *s, size_t n, uint64_t seed) {
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 1099511628211ULL; }
    return h;
}

static uint32_t intern(const char *s) {
    if (!s) return NONE;
    size_t n = strlen(s);
    for (uint64_t probe = 0;; probe++) {     /* a collision re-hashes with another seed */
        uint64_t h = hash_bytes(s, n, probe);
        slot_t *slot = map_find(&string_index, h);
        if (!slot) {
            uint32_t off = (uint32_t)strs.n;
            for (size_t i = 0; i <= n; i++) PUSH(strs, s[i]);
            map_put(&string_index, h, off);
            return off;
        }
        if (strcmp(strs.v + slot->value, s) == 0) return (uint32_t)slot->value;
    }
}

/* ------------------------------------------------------------ attributes */
static const char *attr_str(Dwarf_Die *die, int name) {
    Dwarf_Attribute a;
    if (!dwarf_attr(die, name, &a)) return NULL;
    return dwarf_formstring(&a);
}

/* an integer attribute (a constant form), else 0 with *ok = 0 */
static int64_t attr_int(Dwarf_Die *die, int name, int *ok) {
    Dwarf_Attribute a;
    *ok = 0;
    if (!dwarf_attr(die, name, &a)) return 0;
    switch (dwarf_whatform(&a)) {
    case DW_FORM_sdata: case DW_FORM_implicit_const: {
        Dwarf_Sword v;
        if (dwarf_formsdata(&a, &v) == 0) { *ok = 1; return v; }
        return 0;
    }
    case DW_FORM_data1: case DW_FORM_data2: case DW_FORM_data4: case DW_FORM_data8:
    case DW_FORM_udata: {
        Dwarf_Word v;
        if (dwarf_formudata(&a, &v) == 0) { *ok = 1; return (int64_t)v; }
        return 0;
    }
    default:
        return 0;
    }
}

static int has_attr(Dwarf_Die *die, int name) { return dwarf_hasattr(die, name); }

static int flag_attr(Dwarf_Die *die, int name) {
    Dwarf_Attribute a;
    bool v = false;
    if (!dwarf_attr(die, name, &a)) return 0;
    if (dwarf_formflag(&a, &v) != 0) return 0;
    return v;
}

/* the DIE a reference attribute points at */
static int ref_die(Dwarf_Die *die, int name, Dwarf_Die *out) {
    Dwarf_Attribute a;
    if (!dwarf_attr(die, name, &a)) return 0;
    return dwarf_formref_die(&a, out) != NULL;
}

/* ------------------------------------------------------------------ types */
static int64_t resolve(Dwarf_Die *die);

/* the type of die's DW_AT_type: an index, T_VOID without one, T_UNKNOWN for a bad reference */
static int64_t type_of(Dwarf_Die *die) {
    if (!has_attr(die, DW_AT_type)) return T_VOID;
    Dwarf_Die t;
    if (!ref_die(die, DW_AT_type, &t)) return T_UNKNOWN;
    return resolve(&t);
}

static uint64_t member_offset(Dwarf_Die *die) {
    Dwarf_Attribute a;
    if (dwarf_attr(die, DW_AT_data_member_location, &a)) {
        int form = dwarf_whatform(&a);
        if (form == DW_FORM_exprloc || form == DW_FORM_block1 || form == DW_FORM_block ||
            form == DW_FORM_block2 || form == DW_FORM_block4) {
            Dwarf_Block b;
            if (dwarf_formblock(&a, &b) != 0 || b.length < 2 || b.data[0] != DW_OP_plus_uconst)
                return 0;
            uint64_t result = 0;
            unsigned shift = 0;
            for (size_t i = 1; i < b.length && shift < 64; i++) {
                result |= (uint64_t)(b.data[i] & 0x7f) << shift;
                shift += 7;
                if (!(b.data[i] & 0x80)) break;
            }
            return result;
        }
        int ok;
        int64_t v = attr_int(die, DW_AT_data_member_location, &ok);
        return ok ? (uint64_t)v : 0;
    }
    int ok;
    int64_t bits = attr_int(die, DW_AT_data_bit_offset, &ok);
    return ok ? (uint64_t)(bits / 8) : 0;
}

static int64_t new_type(Dwarf_Die *die, uint32_t kind) {
    type_t t = { kind, intern(attr_str(die, DW_AT_name)), 0, T_VOID, 0, 0,
                 (uint32_t)dwarf_tag(die), 0 };
    int ok;
    int64_t size = attr_int(die, DW_AT_byte_size, &ok);
    t.size = ok ? (uint64_t)size : 0;
    t.pad = ok;                          /* 1: the size is explicit */
    PUSH(types, t);
    int64_t index = (int64_t)types.n - 1;
    map_put(&type_index, dwarf_dieoffset(die), (uint64_t)index);
    return index;
}

static int64_t resolve(Dwarf_Die *die) {
    slot_t *hit = map_find(&type_index, dwarf_dieoffset(die));
    if (hit) return (int64_t)hit->value;
    int tag = dwarf_tag(die);
    uint32_t kind;
    switch (tag) {
    case DW_TAG_base_type: case DW_TAG_unspecified_type: kind = K_BASE; break;
    case DW_TAG_enumeration_type: kind = K_ENUM; break;
    case DW_TAG_structure_type: kind = K_STRUCT; break;
    case DW_TAG_union_type: kind = K_UNION; break;
    case DW_TAG_class_type: kind = K_CLASS; break;
    case DW_TAG_pointer_type: kind = K_POINTER; break;
    case DW_TAG_reference_type: kind = K_REFERENCE; break;
    case DW_TAG_typedef: kind = K_TYPEDEF; break;
    case DW_TAG_const_type: kind = K_CONST; break;
    case DW_TAG_volatile_type: kind = K_VOLATILE; break;
    case DW_TAG_restrict_type: kind = K_RESTRICT; break;
    case DW_TAG_atomic_type: kind = K_ATOMIC; break;
    case DW_TAG_array_type: kind = K_ARRAY; break;
    case DW_TAG_subroutine_type: kind = K_FUNCTION; break;
    default: kind = K_UNKNOWN; break;
    }
    int64_t index = new_type(die, kind);    /* registered first: breaks cycles */
    if (kind == K_STRUCT || kind == K_UNION || kind == K_CLASS) {
        VEC(member_t) mine = {0};
        Dwarf_Die child;
        if (dwarf_child(die, &child) == 0) {
            do {
                if (dwarf_tag(&child) != DW_TAG_member) continue;
                member_t m = { intern(attr_str(&child, DW_AT_name)), 0, member_offset(&child),
                               0, type_of(&child) };
                int ok;
                int64_t size = attr_int(&child, DW_AT_byte_size, &ok);
                m.size = ok ? (uint64_t)size : 0;
                PUSH(mine, m);
            } while (dwarf_siblingof(&child, &child) == 0);
        }
        types.v[index].first = (uint32_t)members.n;
        types.v[index].n = (uint32_t)mine.n;
        for (size_t i = 0; i < mine.n; i++) PUSH(members, mine.v[i]);
        free(mine.v);
    } else if (kind == K_ARRAY) {
        int64_t element = type_of(die);      /* may move types.v: assigned after */
        types.v[index].target = element;
        VEC(int64_t) mine = {0};
        Dwarf_Die child;
        if (dwarf_child(die, &child) == 0) {
            do {
                int ctag = dwarf_tag(&child);
                if (ctag != DW_TAG_subrange_type && ctag != DW_TAG_enumeration_type) continue;
                int ok;
                int64_t count = attr_int(&child, DW_AT_count, &ok);
                if (!ok) {
                    int ok_ub, ok_lb;
                    int64_t ub = attr_int(&child, DW_AT_upper_bound, &ok_ub);
                    int64_t lb = attr_int(&child, DW_AT_lower_bound, &ok_lb);
                    count = ok_ub ? ub - (ok_lb ? lb : 0) + 1 : -1;
                    if (ok_ub && count < 0) count = 0;
                }
                PUSH(mine, count);
            } while (dwarf_siblingof(&child, &child) == 0);
        }
        types.v[index].first = (uint32_t)dims.n;
        types.v[index].n = (uint32_t)mine.n;
        for (size_t i = 0; i < mine.n; i++) PUSH(dims, mine.v[i]);
        free(mine.v);
    } else if (kind != K_BASE && kind != K_ENUM && kind != K_FUNCTION && kind != K_UNKNOWN) {
        int64_t target = type_of(die);       /* may move types.v: assigned after */
        types.v[index].target = target;
    }
    return index;
}

/* -------------------------------------------------------------- variables */
static int location_address(Dwarf_Die *die, uint64_t *address) {
    Dwarf_Attribute a;
    if (!dwarf_attr(die, DW_AT_location, &a)) return 0;
    int form = dwarf_whatform(&a);
    if (form != DW_FORM_exprloc && form != DW_FORM_block1 && form != DW_FORM_block &&
        form != DW_FORM_block2 && form != DW_FORM_block4) return 0;
    Dwarf_Block b;
    if (dwarf_formblock(&a, &b) != 0 || b.length != 9 || b.data[0] != DW_OP_addr) return 0;
    uint64_t v = 0;
    for (int i = 8; i >= 1; i--) v = (v << 8) | b.data[i];
    *address = v;
    return 1;
}

static int origin_of(Dwarf_Die *die, Dwarf_Die *out) {
    if (has_attr(die, DW_AT_specification)) return ref_die(die, DW_AT_specification, out);
    if (has_attr(die, DW_AT_abstract_origin)) return ref_die(die, DW_AT_abstract_origin, out);
    return 0;
}

static void collect(Dwarf_Die *parent, uint32_t scope, uint32_t cu, int depth) {
    Dwarf_Die die;
    if (depth > 256 || dwarf_child(parent, &die) != 0) return;
    do {
        int tag = dwarf_tag(&die);
        if (tag == DW_TAG_variable) {
            uint64_t address;
            if (!location_address(&die, &address)) continue;
            Dwarf_Die origin, *src = &die;
            const char *name = attr_str(&die, DW_AT_name);
            if (!name || !has_attr(&die, DW_AT_type)) {
                if (origin_of(&die, &origin)) {
                    src = &origin;
                    if (!name) name = attr_str(&origin, DW_AT_name);
                }
            }
            if (!name || !*name) continue;
            uint64_t key = hash_bytes(name, strlen(name), address);
            uint32_t name_off = intern(name);
            /* the first (name, address) wins; the key's rare collisions are told apart */
            slot_t *hit = map_find(&var_seen, key);
            int seen = 0;
            if (hit) {
                var_t *other = &vars.v[hit->value];
                seen = other->name == name_off && other->address == address;
                for (size_t i = 0; i < vars.n && !seen; i++)   /* a true collision */
                    seen = vars.v[i].name == name_off && vars.v[i].address == address;
            }
            if (seen) continue;
            if (!hit) map_put(&var_seen, key, vars.n);
            int external = flag_attr(&die, DW_AT_external) ||
                           (src != &die && flag_attr(src, DW_AT_external));
            var_t v = { name_off, scope, cu, (uint32_t)external, address, type_of(src) };
            PUSH(vars, v);
        } else if (tag == DW_TAG_subprogram || tag == DW_TAG_lexical_block ||
                   tag == DW_TAG_namespace || tag == DW_TAG_inlined_subroutine) {
            if (!dwarf_haschildren(&die)) continue;
            uint32_t sub = scope;
            if (tag == DW_TAG_subprogram) {
                const char *name = attr_str(&die, DW_AT_name);
                if (!name) {
                    Dwarf_Die origin;
                    if (origin_of(&die, &origin)) {
                        name = attr_str(&origin, DW_AT_name);
                        sub = name ? intern(name) : NONE;   /* an origin without a name: none */
                    }
                } else {
                    sub = intern(name);
                }
            }
            collect(&die, sub, cu, depth + 1);
        }
    } while (dwarf_siblingof(&die, &die) == 0);
}

/* ------------------------------------------------------------------ lines */
static map_t file_index;   /* string offset -> index in files */

static void unit_lines(Dwarf_Die *cudie) {
    Dwarf_Lines *table;
    size_t n;
    if (dwarf_getsrclines(cudie, &table, &n) != 0) return;
    const char *comp_dir = attr_str(cudie, DW_AT_comp_dir);
    static char *joined;
    static size_t joined_size;
    for (size_t i = 0; i < n; i++) {
        Dwarf_Line *line = dwarf_onesrcline(table, i);
        Dwarf_Addr address;
        if (!line || dwarf_lineaddr(line, &address) != 0) continue;
        bool end = false;
        dwarf_lineendsequence(line, &end);
        line_t row = { address, -1, 0 };
        if (!end) {
            const char *src = dwarf_linesrc(line, NULL, NULL);
            uint32_t off;
            if (src && src[0] != '/' && comp_dir && *comp_dir) {   /* absolute, as pyelftools' */
                size_t need = strlen(comp_dir) + strlen(src) + 2;
                if (need > joined_size) {
                    joined_size = need * 2;
                    joined = realloc(joined, joined_size);
                    if (!joined) { perror("mtdwarf"); exit(1); }
                }
                snprintf(joined, joined_size, "%s/%s", comp_dir, src);
                off = intern(joined);
            } else {
                off = intern(src ? src : "<file ?>");
            }
            slot_t *hit = map_find(&file_index, off);
            if (!hit) {
                map_put(&file_index, off, files.n);
                PUSH(files, off);
                hit = map_find(&file_index, off);
            }
            int lineno = 0;
            dwarf_lineno(line, &lineno);
            row.file = (int32_t)hit->value;
            row.line = lineno;
        }
        PUSH(lines, row);
    }
}

/* ------------------------------------------------------------------ output */
static void section(FILE *out, const char *tag, const void *items, size_t n, size_t size) {
    uint64_t head[2] = { n, (uint64_t)(n * size) };
    if (fwrite(tag, 1, 4, out) != 4 || fwrite(head, sizeof head, 1, out) != 1 ||
        (n && fwrite(items, size, n, out) != n)) {
        perror("mtdwarf: write");
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mtdwarf FILE OUT\n");
        return 1;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror(argv[1]); return 1; }
    Dwarf *dw = dwarf_begin(fd, DWARF_C_READ);
    if (!dw) { fprintf(stderr, "mtdwarf: %s: no DWARF\n", argv[1]); return 2; }
    Dwarf_CU *cu = NULL;
    Dwarf_Half version;
    uint8_t unit_type;
    Dwarf_Die cudie;
    while (dwarf_get_units(dw, cu, &cu, &version, &unit_type, &cudie, NULL) == 0) {
        if (unit_type != DW_UT_compile && unit_type != DW_UT_partial) continue;
        const char *cu_name = attr_str(&cudie, DW_AT_name);
        collect(&cudie, NONE, intern(cu_name ? cu_name : ""), 0);
        unit_lines(&cudie);
    }
    FILE *out = fopen(argv[2], "wb");
    if (!out) { perror(argv[2]); return 1; }
    if (fwrite("MTDW0001", 1, 8, out) != 8) { perror("mtdwarf: write"); return 1; }
    section(out, "STRS", strs.v, strs.n, 1);
    section(out, "TYPE", types.v, types.n, sizeof(type_t));
    section(out, "MEMB", members.v, members.n, sizeof(member_t));
    section(out, "DIMS", dims.v, dims.n, sizeof(int64_t));
    section(out, "VARS", vars.v, vars.n, sizeof(var_t));
    section(out, "LINE", lines.v, lines.n, sizeof(line_t));
    section(out, "FILE", files.v, files.n, sizeof(uint32_t));
    if (fclose(out) != 0) { perror("mtdwarf: write"); return 1; }
    dwarf_end(dw);
    close(fd);
    return 0;
}
