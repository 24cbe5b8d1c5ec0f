"""A real single-node Ceph (mon, mgr, memstore OSD, RADOS Gateway) for tests: see ceph.py."""
