"""The startup kits ``provision`` writes, as FLARE itself reads them (no participant runs)."""

from __future__ import annotations

from pathlib import Path

from plumbing.network import free_port
from proxyfl.launch.kits import ADMIN_MESSAGE_TIMEOUT_S, Project, provision


def test_the_administrator_waits_for_a_loaded_server_longer_than_flares_two_seconds(
    tmp_path: Path,
) -> None:
    """With FLARE's settings an administrator gave up after one unanswered message of 2 s
    ("failed to challenge server: timeout") while the server, on a loaded 2-core machine,
    was about to answer; the kit's own settings, as FLARE loads them (its tamper check
    included), wait longer."""
    from nvflare.apis.workspace import Workspace
    from nvflare.fuel.hci.client.api_spec import AdminConfigKey
    from nvflare.fuel.hci.client.config import secure_load_admin_config

    kits = provision(Project("proxyfl", "localhost", free_port(), ("centre-0",)), tmp_path)
    loaded = secure_load_admin_config(Workspace(root_dir=str(kits.admin))).get_admin_config()
    assert loaded[AdminConfigKey.AUTHENTICATE_MSG_TIMEOUT] == ADMIN_MESSAGE_TIMEOUT_S > 2.0
    assert loaded[AdminConfigKey.LOGIN_TIMEOUT] == ADMIN_MESSAGE_TIMEOUT_S > 10.0
    assert loaded[AdminConfigKey.PORT] == kits.project.port  # the rest as provisioned
