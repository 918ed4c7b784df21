"""The suite runs under `--dist loadgroup` (.ci/test): the tests of a module marked `xdist_group(NAME)` run on one
worker, so its module fixtures (a server, an engine, a checkpoint) are built once, and the tests that start
processes of their own (group "tp") never run beside each other. pytest-xdist tells its scheduler a test's group by
appending `@NAME` to the test's node id; pytest 9.2 computes node ids without reading what xdist 3.8 sets, and then
every group is spread over the workers (settings.ini asks for pytest<9.2). This test fails when that happens."""
import pytest

pytestmark = pytest.mark.xdist_group("xdist_check")


def test_the_group_is_in_the_node_id(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("run without --dist loadgroup (.ci/test runs the suite with it)")
    assert request.node.nodeid.endswith("@xdist_check"), f"xdist groups are ignored: {request.node.nodeid}"
