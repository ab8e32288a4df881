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


def test_a_job_may_name_this_packages_classes_alone(tmp_path: Path) -> None:
    """FLARE's own check of a job's components, on each kit's resources: the two classes a
    job of this project names pass; one of FLARE's own (on FLARE's default list) and any
    other are refused, at the server and at a site."""
    import pytest
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.apis.workspace import Workspace
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    kits = provision(Project("proxyfl", "localhost", free_port(), ("centre-0",)), tmp_path)
    for kit in (kits.server, kits.site("centre-0")):
        workspace = Workspace(root_dir=str(kit))
        authorizer = ComponentPathAuthorizer()
        for ours in ("proxyfl.sites.controller.RunController",
                     "proxyfl.sites.executor.RankExecutor"):  # fmt: skip
            authorizer.authorize_component_config({"path": ours}, workspace=workspace)
        for theirs in ("nvflare.app_common.psi.file_psi_writer.FilePSIWriter",
                       "nvflare.app_common.np.np_model_locator.NPModelLocator",
                       "proxyfl.run.run_rank", "os.system"):  # fmt: skip
            with pytest.raises(UnsafeComponentError, match="not in allow_list"):
                authorizer.authorize_component_config({"path": theirs}, workspace=workspace)
