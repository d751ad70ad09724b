"""The simulator's numba cache follows its sources: a stale stamp drops the cached machine code."""

from worldmodel.groundtruth import STAMP, invalidate_stale_cache, sources_digest


def test_a_changed_source_drops_the_cache(tmp_path):
    (tmp_path / "engine.run_until-254.py311.nbi").write_bytes(b"index")
    (tmp_path / "engine.run_until-254.py311.1.nbc").write_bytes(b"code")
    (tmp_path / STAMP).write_text("0" * 16)  # the digest of other sources
    assert invalidate_stale_cache(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAMP]
    assert (tmp_path / STAMP).read_text() == sources_digest()


def test_unchanged_sources_keep_the_cache(tmp_path):
    (tmp_path / STAMP).write_text(sources_digest())
    (tmp_path / "engine.run_until-254.py311.nbi").write_bytes(b"index")
    assert not invalidate_stale_cache(tmp_path)
    assert (tmp_path / "engine.run_until-254.py311.nbi").exists()


def test_a_cache_without_a_stamp_is_dropped_and_stamped(tmp_path):
    (tmp_path / "engine.run_until-254.py311.nbi").write_bytes(b"index")
    assert invalidate_stale_cache(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAMP]


def _copy_sources(root):
    """The simulator's source directories copied under root (same names, same path order)."""
    import shutil

    from worldmodel.groundtruth import SOURCES_DIRS

    dirs = []
    for d in SOURCES_DIRS:
        dst = root / d.name
        dst.mkdir()
        for f in d.glob("*.py"):
            shutil.copy2(f, dst / f.name)
        dirs.append(dst)
    return tuple(dirs)


def test_the_cache_key_follows_every_byte_of_the_sources(tmp_path):
    """The key over a copy equals the live key; one byte changed in any source (the engine, a physics module
    it inlines) changes it, and so does a new source file. The live sources are never touched."""
    dirs = _copy_sources(tmp_path)
    assert sources_digest(dirs) == sources_digest()
    for victim in (dirs[0] / "engine.py", dirs[1] / sorted(p.name for p in dirs[1].glob("*.py"))[-1]):
        data = victim.read_bytes()
        victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        assert sources_digest(dirs) != sources_digest()
        victim.write_bytes(data)
        assert sources_digest(dirs) == sources_digest()
    (dirs[1] / "extra.py").write_text("X = 1\n")
    assert sources_digest(dirs) != sources_digest()

