"""The startup kits of a FLARE project: one per site, one for the server, one for its
administrator, each holding the project's root certificate and its own certificate and key
(``nvflare provision``), the connections mutual TLS (``connection_security: mtls``).

:func:`provision` writes them from a :class:`Project`; :func:`site_local_settings` then
fills each kit's ``local/`` folder with what this project needs of a site:

- ``resources.json``: FLARE's defaults, but for the list of classes a job may name: this
  package's and the one FLARE adds to every job (:data:`FLARE_JOB_COMPONENTS`), where
  FLARE's lists some 80 of its own (FLARE refuses any other: a job of ours names only
  :class:`~proxyfl.sites.controller.RunController` and
  :class:`~proxyfl.sites.executor.RankExecutor`, installed code, never code sent with the
  job); the server's job and snapshot stores inside its kit (FLARE's default is
  ``/tmp/nvflare``, shared by every project of the machine); how long the server waits for a
  silent site before it drops it (``heart_beat_timeout``); with ``warm_jobs`` (the kits of
  the launcher's own participants, and ``camelyon-proxyfl sites provision``'s),
  :class:`~proxyfl.sites.warm_launcher.WarmJobLauncher` as the sites' job launcher and
  :class:`~proxyfl.sites.warm_launcher.WarmServerJobLauncher` as the server's, which fork
  a job's process from the warm server the participant's environment names (``sites
  start`` runs one for each), else start it as FLARE does;
- ``comm_config.json``: gRPC without ``SO_REUSEPORT`` (with it, a second server binds a port
  already taken and says nothing), and messages up to FLARE's frame limit;
- ``authorization.json``: FLARE's default policy but for the administrator's role
  (``project_admin``), which it grants everything: here it submits, manages and downloads
  jobs and operates the participants, but runs no shell command on a participant's kit
  folder and sends no code with a job (``byoc``), so that the one who coordinates the
  federation cannot read a hospital's files through FLARE.

:func:`admin_settings` gives the administrator's kit its patience with a loaded server
(:data:`ADMIN_MESSAGE_TIMEOUT_S`), in ``startup/fed_admin.json``, which FLARE checks
against a signature only where the kit has one (an administrator's has none).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from plumbing.atomic import write_json, write_text

logger = logging.getLogger(__name__)

ORGANISATION = "proxyfl"
ADMIN = "admin@proxyfl.org"
# the package prefix a job's components may come from (FLARE's class_allow_list: a prefix
# ends with a dot)
ALLOWED_PACKAGE = "proxyfl.sites."
# what FLARE adds to every job's configuration itself: a site's SiteLogStreamer adds one that
# sends the job's error log to the server
FLARE_JOB_COMPONENTS = ("nvflare.app_common.logging.job_log_streamer.JobLogStreamer",)
# the administrator's rights at every participant (module doc): no shell, no code sent
ADMIN_RIGHTS = {"submit_job": "any", "clone_job": "any", "manage_job": "any",
                "download_job": "any", "view": "any", "operate": "any",
                "shell_commands": "none", "byoc": "none",
                "server-predeployed-flwr": "none"}  # fmt: skip
# FLARE's largest frame (2 GiB less 2 MiB): a message is streamed in chunks below it
MAX_MESSAGE_BYTES = 2_145_386_496
# how often the server's scheduler looks for a job to start (FLARE's default: 10 s, which a
# job waited before its sites were given it)
JOB_SCHEDULE_INTERVAL_S = 1.0
_SITE_NAME = re.compile(r"[a-z0-9][a-z0-9\-]*")
SERVER_MODULE = "nvflare.private.fed.app.server.server_train"
SITE_MODULE = "nvflare.private.fed.app.client.client_train"
JOB_LAUNCHER_ID = "process_launcher"  # the component that starts a site's job processes
WARM_JOB_LAUNCHER = "proxyfl.sites.warm_launcher.WarmJobLauncher"
WARM_SERVER_JOB_LAUNCHER = "proxyfl.sites.warm_launcher.WarmServerJobLauncher"
# how long the administrator waits for the server's answer to one message of its login (the
# identity challenge, the registration): the 2 s FLARE's kits are given (10 s for the login)
# failed a session outright on a loaded 2-core machine ("failed to challenge server:
# timeout", its answer "too late"); a timed-out message is not retried, only an unreachable
# server is
ADMIN_MESSAGE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Project:
    """Who takes part: the server (``server_host``: the name the sites connect to, in its
    certificate; ``port``: its one port, for the sites and the administrator) and the
    sites, by name."""

    name: str
    server_host: str
    port: int
    sites: tuple[str, ...]
    heart_beat_timeout_s: int = 60

    def __post_init__(self) -> None:
        for site in self.sites:
            if not _SITE_NAME.fullmatch(site):
                raise ValueError(f"{site!r} is not a site name (lower-case letters, digits, -)")
        if len(set(self.sites)) != len(self.sites):
            raise ValueError(f"a site is named twice: {list(self.sites)}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port")

    def project_file(self) -> dict:
        """``project.yml`` for ``nvflare provision``."""
        server = {"name": self.server_host, "type": "server", "org": ORGANISATION,
                  "fed_learn_port": self.port, "admin_port": self.port,
                  "connection_security": "mtls"}  # fmt: skip
        sites = [{"name": site, "type": "client", "org": ORGANISATION,
                  "connection_security": "mtls"} for site in self.sites]  # fmt: skip
        admin = {"name": ADMIN, "type": "admin", "org": ORGANISATION, "role": "project_admin"}
        return {
            "api_version": 3,
            "name": self.name,
            "description": "ProxyFL across centres (camelyon-proxyfl)",
            "participants": [server, *sites, admin],
            "builders": [
                {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
                 "args": {"template_file": ["master_template.yml"]}},
                {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder",
                 "args": {"config_folder": "config", "scheme": "grpc"}},
                {"path": "nvflare.lighter.impl.cert.CertBuilder"},
                {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
            ],
        }  # fmt: skip


@dataclass(frozen=True)
class Kits:
    """Where ``nvflare provision`` wrote a project's kits."""

    root: Path  # .../PROJECT/prod_NN
    project: Project

    @property
    def server(self) -> Path:
        return self.root / self.project.server_host

    @property
    def admin(self) -> Path:
        return self.root / ADMIN

    def site(self, name: str) -> Path:
        return self.root / name


class ProvisionError(RuntimeError):
    """``nvflare provision`` failed."""


class KitError(ValueError):
    """A folder is not a startup kit that runs: not a kit, or an administrator's."""


@dataclass(frozen=True)
class Participant:
    """What a startup kit makes its holder: the server (``name``: the host name the sites
    connect to) or a site (``name``: its own, in its certificate)."""

    kit: Path
    role: Literal["server", "site"]
    name: str

    @classmethod
    def of(cls, kit: Path) -> Participant:
        """The participant of ``kit``; a :class:`KitError` naming it and why not."""
        startup = kit / "startup"
        if (startup / "fed_server.json").is_file():
            (server, *_) = json.loads((startup / "fed_server.json").read_text())["servers"]
            participant = cls(kit, "server", str(server["admin_server"]))
        elif (startup / "fed_client.json").is_file():
            client = json.loads((startup / "fed_client.json").read_text())["client"]
            participant = cls(kit, "site", str(client["fqsn"]))
        elif (startup / "fed_admin.json").is_file():
            raise KitError(f"{kit}: an administrator's kit: it submits and follows jobs "
                           "(FLARE's admin console), it does not run as a participant")  # fmt: skip
        else:
            raise KitError(f"{kit}: not a FLARE startup kit (no startup/fed_server.json "
                           "or startup/fed_client.json)")  # fmt: skip
        resources = kit / "local" / "resources.json"
        if ALLOWED_PACKAGE not in (resources.read_text() if resources.is_file() else ""):
            raise KitError(
                f"{resources}: {ALLOWED_PACKAGE} is not on its class_allow_list, so "
                "FLARE would refuse the job's classes: provision the kits with "
                "`camelyon-proxyfl sites provision`, or add it (docs/sites.md)"
            )
        return participant

    def command(self) -> list[str]:
        """FLARE's process for this participant, as the kit's ``start.sh`` runs it, with
        this interpreter (the one that has this package)."""
        server = self.role == "server"
        settings = [f"org={ORGANISATION}", *([] if server else [f"uid={self.name}"])]
        return [sys.executable, "-u", "-m", SERVER_MODULE if server else SITE_MODULE,
                "-m", str(self.kit.resolve()), "-s",
                "fed_server.json" if server else "fed_client.json",
                "--set", "secure_train=true", "config_folder=config", *settings]  # fmt: skip


def provision(project: Project, out: Path, warm_jobs: bool = False) -> Kits:
    """Write ``project``'s kits under ``out`` (a new CA each time) and their local settings;
    ``warm_jobs``: the sites fork their job processes from the warm server their
    environment names (sites on the machine of the launch that started one).

    ``out`` is the provisioner's alone (0700), and so is every file ``nvflare provision``
    writes (umask 077): its ``state/cert.json`` holds the CA's private key and every
    participant's, which it writes with the process's umask (0644 under the usual 022:
    anyone on the machine could have issued a certificate for any centre)."""
    out = out.resolve()  # nvflare provision runs in it
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    project_file = out / "project.yml"
    write_text(project_file, yaml.safe_dump(project.project_file(), sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "nvflare.cli", "provision", "-p", str(project_file),
         "-w", str(out)],
        cwd=out, capture_output=True, text=True, timeout=300, umask=0o077,
    )  # fmt: skip
    roots = sorted((out / project.name).glob("prod_*"))
    if done.returncode != 0 or not roots:
        said = (done.stdout + done.stderr).strip().splitlines()
        raise ProvisionError(f"nvflare provision failed ({done.returncode}): "
                             f"{said[-1] if said else 'no output'}")  # fmt: skip
    kits = Kits(roots[-1], project)
    site_local_settings(kits.server, server=True, warm_jobs=warm_jobs,
                        heart_beat_timeout_s=project.heart_beat_timeout_s)  # fmt: skip
    for site in project.sites:
        site_local_settings(kits.site(site), server=False, warm_jobs=warm_jobs)
    admin_settings(kits.admin)
    return kits


def admin_settings(kit: Path, message_timeout_s: float = ADMIN_MESSAGE_TIMEOUT_S) -> None:
    """The administrator's ``kit`` waits up to ``message_timeout_s`` for the server's answer
    to each message of its login (module doc)."""
    path = kit / "startup" / "fed_admin.json"
    settings = json.loads(path.read_text())
    settings["admin"].update({"authenticate_msg_timeout": message_timeout_s,
                              "login_timeout": message_timeout_s})  # fmt: skip
    write_json(path, settings)


def site_local_settings(kit: Path, server: bool, heart_beat_timeout_s: int = 60,
                        warm_jobs: bool = False) -> None:  # fmt: skip
    """``kit``'s ``local/resources.json`` and ``local/comm_config.json`` (module doc)."""
    local = kit / "local"
    resources = json.loads((local / "resources.json.default").read_text())
    # this package's classes and what FLARE puts in every job: FLARE's default list names some
    # 80 of its own, for jobs a site of this project never runs (a file writer, a model
    # locator among them)
    resources["class_allow_list"] = [ALLOWED_PACKAGE, *FLARE_JOB_COMPONENTS]
    resources["class_list_enforcement_mode"] = "enforce"
    if server:
        for entry in resources.get("servers", []):
            entry["heart_beat_timeout"] = heart_beat_timeout_s
        for component in resources.get("components", []):
            if component.get("id") == "job_scheduler":  # a submitted job waited up to 10 s
                component["args"]["min_schedule_interval"] = JOB_SCHEDULE_INTERVAL_S
        _store_in(resources, kit)
    if warm_jobs:
        for component in resources.get("components", []):
            if component.get("id") == JOB_LAUNCHER_ID:
                component["path"] = WARM_SERVER_JOB_LAUNCHER if server else WARM_JOB_LAUNCHER
    write_json(local / "resources.json", resources)
    grpc_options = [["grpc.so_reuseport", 0],
                    ["grpc.max_send_message_length", MAX_MESSAGE_BYTES],
                    ["grpc.max_receive_message_length", MAX_MESSAGE_BYTES]]  # fmt: skip
    write_json(local / "comm_config.json", {"grpc": {"options": grpc_options}})
    policy = json.loads((local / "authorization.json.default").read_text())
    policy["permissions"]["project_admin"] = ADMIN_RIGHTS
    write_json(local / "authorization.json", policy)


def _store_in(resources: dict, kit: Path) -> None:
    """The server's job and snapshot stores in ``kit``'s ``storage/`` where it is now."""
    storage = kit.resolve() / "storage"
    for component in resources.get("components", []):
        if component.get("id") == "job_manager":
            component["args"]["uri_root"] = str(storage / "jobs")
    persistor = resources.get("snapshot_persistor", {}).get("args", {})
    if "storage" in persistor:
        persistor["storage"]["args"]["root_dir"] = str(storage / "snapshots")


def store_in_place(kit: Path) -> None:
    """A server's kit, copied to its machine, keeps its stores in its own folder there."""
    path = kit / "local" / "resources.json"
    resources = json.loads(path.read_text())
    _store_in(resources, kit)
    write_json(path, resources)
