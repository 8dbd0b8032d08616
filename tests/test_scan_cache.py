"""The module-scan cache (calls/scan_cache.py): a binary's call-site scan and
address-taken set kept on disk per binary file.  The oracle is the scan made
from the file (find_call_sites, address_taken) in the same test."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from madtrace.arch.x86_64.callsites import address_taken, find_call_sites
from madtrace.binary import elf
from madtrace.cache import disk
from madtrace.calls import scan_cache

from .util import ROOT, prog

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _libpython():
    """The libpython this interpreter runs on (a shared one), else None."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libpython" in os.path.basename(path) and ".so" in path:
                return path
    return None


def _image(path):
    """A new parse of the file (not the per-process image cache)."""
    with open(path, "rb") as f:
        return elf.ElfImage(f.read(), os.path.basename(path), path)


def _fresh(path):
    image = _image(path)
    return find_call_sites(image), address_taken(image)


def _same(cached, fresh):
    (scan, taken), (want, want_taken) = cached, fresh
    assert [(s.address, s.kind, s.target, s.caller, s.prefix_len) for s in scan.sites] == \
        [(s.address, s.kind, s.target, s.caller, s.prefix_len) for s in want.sites]
    assert scan.unpatchable == want.unpatchable
    assert scan.function_starts == want.function_starts
    assert (scan.instructions, scan.sections) == (want.instructions, want.sections)
    assert np.array_equal(scan.branch_targets, want.branch_targets)
    assert np.array_equal(scan.branch_sources, want.branch_sources)
    assert taken == want_taken
    by_target = want.by_target()
    for target in list(by_target)[:2000] + [0, -1, max(by_target, default=0) + 1]:
        assert scan.sites_to(target) == by_target.get(target, [])
    lo, hi = (int(want.branch_targets[0]), int(want.branch_targets[-1])) \
        if len(want.branch_targets) else (0, 0)
    assert scan.branches_into(lo, hi) == want.branches_into(lo, hi)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MADTRACE_CACHE_DIR", str(tmp_path / "cache"))
    said: list[str] = []
    monkeypatch.setattr(disk, "notify", said.append)
    return tmp_path / "cache", said


def _targets():
    out = [LIBC, prog("calls_callbacks", "O2-pie"), prog("calls_callbacks", "O0-nopie"),
           prog("calls_callbacks", "O2-pie-stripped"), prog("bench_data_compute", "O2-nopie")]
    lib = _libpython()
    return out + ([lib] if lib else [])


@pytest.mark.parametrize("path", _targets(), ids=os.path.basename)
def test_cached_scan_equals_fresh_scan(cache, path):
    folder, said = cache
    image = _image(path)
    built, loaded = scan_cache.built, scan_cache.loaded
    first = scan_cache.scan_of(image)                  # scanned and written
    assert (scan_cache.built, scan_cache.loaded) == (built + 1, loaded)
    second = scan_cache.scan_of(_image(path))    # read back
    assert (scan_cache.built, scan_cache.loaded) == (built + 1, loaded + 1)
    fresh = _fresh(path)
    _same(first, fresh)
    _same(second, fresh)
    assert said == []
    (entry,) = [e for e in os.listdir(folder) if e.endswith(scan_cache.SUFFIX)]
    assert entry == disk.cache_key(image) + scan_cache.SUFFIX


def test_libpython_is_covered():
    """The interpreter the tests run on has a shared libpython (as Debian's python3.11 has)."""
    assert _libpython() is not None, "this interpreter links libpython statically"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "old-format"])
def test_corrupt_entry_is_rebuilt_with_one_line(cache, damage):
    folder, said = cache
    path = prog("calls_callbacks", "O2-pie")
    scan_cache.scan_of(_image(path))
    (entry,) = [folder / e for e in os.listdir(folder) if e.endswith(scan_cache.SUFFIX)]
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(b"not a cache file")
    elif damage == "empty":
        data = bytearray()
    else:
        data = data.replace(b'"format": %d' % scan_cache.FORMAT, b'"format": 999')
    entry.write_bytes(bytes(data))
    built = scan_cache.built
    result = scan_cache.scan_of(_image(path))
    assert len(said) == 1 and "scan cache" in said[0] and "corrupt" in said[0] \
        and "rebuilt" in said[0], said
    assert scan_cache.built == built + 1
    _same(result, _fresh(path))
    disk.read_entry(str(entry), scan_cache.MAGIC, scan_cache.FORMAT)     # intact again
    scan_cache.scan_of(_image(path))
    assert len(said) == 1


def test_content_that_does_not_hold_together_is_corrupt(cache):
    """A well-formed entry (magic, checksum) whose arrays disagree is rebuilt too."""
    folder, said = cache
    path = prog("calls_callbacks", "O2-pie")
    image = _image(path)
    header, payload = scan_cache.encode(*_fresh(path))
    header["arrays"][0][2] += 1                       # one more site than there are bytes
    os.makedirs(folder, exist_ok=True)
    disk.write_entry(scan_cache.entry_path(image), header, payload,
                        scan_cache.MAGIC, scan_cache.FORMAT)
    _same(scan_cache.scan_of(image), _fresh(path))
    assert len(said) == 1 and "corrupt" in said[0]


SOURCE = """
static int __attribute__((noinline)) leaf(int x) { return x * %d; }
int __attribute__((noinline)) middle(int x) { return leaf(x) + leaf(x + 1); }
int main(int argc, char **argv) { (void)argv; return middle(argc) & 1; }
"""


@pytest.mark.parametrize("flags", [["-no-pie"], ["-fPIE", "-pie"]], ids=["nopie", "pie"])
def test_rebuilt_binary_does_not_read_the_old_entry(cache, tmp_path, flags):
    folder, said = cache
    binary = tmp_path / "prog"

    def build(factor, extra):
        (tmp_path / "p.c").write_text(SOURCE % factor + extra)
        subprocess.run(["gcc", "-O2", *flags, "-Wl,--build-id", "-o", str(binary),
                        str(tmp_path / "p.c")], check=True)

    build(3, "")
    first = scan_cache.scan_of(_image(str(binary)))
    key = disk.cache_key(_image(str(binary)))
    build(5, "int extra(int y) { return middle(y) * 7; }\n")   # another build-id, other code
    image = _image(str(binary))
    assert disk.cache_key(image) != key
    loaded, built = scan_cache.loaded, scan_cache.built
    second = scan_cache.scan_of(image)
    assert (scan_cache.loaded, scan_cache.built) == (loaded, built + 1)
    _same(second, _fresh(str(binary)))
    assert {s.caller for s in second[0].sites} != {s.caller for s in first[0].sites}
    assert len([e for e in os.listdir(folder) if e.endswith(scan_cache.SUFFIX)]) == 2 and said == []


def test_record_data_loads_libc_scan_from_the_cache(tmp_path):
    """A second `record --data` process scans nothing: every module it scans comes
    from the cache the first one filled (the lead's data-tracing start-up)."""
    env = dict(os.environ, MADTRACE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
    code = ("import sys, runpy; from madtrace.calls import scan_cache as c; sys.argv = sys.argv[1:];"
            "import atexit; atexit.register(lambda: print('SCANS', c.built, c.loaded, file=sys.stderr));"
            "runpy.run_module('madtrace.cli.main', run_name='__main__')")
    argv = [sys.executable, "-c", code, "madtrace", "record", "--data", "--no-functions", "--no-store",
            "-o", str(tmp_path / "t"), "--force", "--", prog("bench_data_compute", "O2-nopie"), "3", "16"]
    counts = []
    for _ in range(2):
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        (line,) = [x for x in run.stderr.splitlines() if x.startswith("SCANS")]
        counts.append(tuple(int(v) for v in line.split()[1:]))
    assert counts[0][0] >= 1 and counts[0][1] == 0, counts        # libc scanned, written
    assert counts[1] == (0, counts[0][0]), counts                  # all read back
    listed = subprocess.run([sys.executable, "-m", "madtrace.cli.main", "cache", "list", "--json"],
                            env=env, capture_output=True, text=True, timeout=120)
    scans = json.loads(listed.stdout)["scans"]
    assert len(scans) == counts[0][0] and all(e["ok"] for e in scans)
    assert os.path.realpath(LIBC) in {e["binary"] for e in scans}


# ------------------------------------------------- the ELF symbol cache (elfcache.py)
from madtrace.binary import elfcache  # noqa: E402


def _tables(image):
    return ([(s.name, s.address, s.size, s.kind, s.binding, s.section, s.dynamic)
             for s in image.symbols],
            [(s.name, s.address, s.size) for s in image.plt_symbols], dict(image.plt))


@pytest.mark.parametrize("path", _targets(), ids=os.path.basename)
def test_cached_symbols_equal_parsed_symbols(cache, tmp_path, path):
    folder, said = cache
    loaded, built = elfcache.loaded, elfcache.built
    first = _image(path)                                   # parsed and written
    second = _image(path)                                  # read back
    assert (elfcache.loaded, elfcache.built) == (loaded + 1, built + 1)
    with open(path, "rb") as f:                            # no path: never cached
        fresh = elf.ElfImage(f.read(), os.path.basename(path), None)
    assert _tables(first) == _tables(second) == _tables(fresh)
    for sym in fresh.symbols[::max(1, len(fresh.symbols) // 50)]:
        assert second.symbol_at(sym.address) == fresh.symbol_at(sym.address)
    assert said == [] and any(e.endswith(elfcache.SUFFIX) for e in os.listdir(folder))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_symbol_entry_is_rebuilt_with_one_line(cache, damage):
    folder, said = cache
    path = prog("calls_callbacks", "O2-pie")
    want = _tables(_image(path))
    (entry,) = [folder / e for e in os.listdir(folder) if e.endswith(elfcache.SUFFIX)]
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-3] ^= 0xFF
    else:
        data = bytearray(b"MTELF001 but nothing else")
    entry.write_bytes(bytes(data))
    assert _tables(_image(path)) == want
    assert len(said) == 1 and "symbol-table cache" in said[0] and "rebuilt" in said[0], said
    assert _tables(_image(path)) == want and len(said) == 1


@pytest.mark.parametrize("flags", [["-no-pie"], ["-fPIE", "-pie"]], ids=["nopie", "pie"])
def test_rebuilt_binary_reads_no_old_symbol_entry(cache, tmp_path, flags):
    folder, said = cache
    binary = tmp_path / "prog"
    for factor, extra in ((3, ""), (5, "int extra(int y) { return middle(y) * 7; }\n")):
        (tmp_path / "p.c").write_text(SOURCE % factor + extra)
        subprocess.run(["gcc", "-O2", *flags, "-o", str(binary), str(tmp_path / "p.c")], check=True)
        loaded = elfcache.loaded
        image = _image(str(binary))
        assert elfcache.loaded == loaded                    # a new build-id: parsed
        assert ("extra" in {s.name for s in image.symbols}) == bool(extra)
    assert len([e for e in os.listdir(folder) if e.endswith(elfcache.SUFFIX)]) == 2 and said == []
