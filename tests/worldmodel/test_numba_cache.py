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
