"""The Kubernetes manifests of ``deploy/kubernetes/`` against the API schemas they target (issue 39).

No cluster can run here, so what is checked is every document of every manifest against the
OpenAPI-derived JSON schemas that ``kubernetes-validate`` (the dev extra) carries for each
Kubernetes release, offline, in strict mode (a field the API does not have is an error, so a
misspelt one is caught): at the oldest release the manifests say they need (1.29, for
``backoffLimitPerIndex`` and ``podReplacementPolicy``) and at the newest the package knows.
The first run found ``podFailurePolicy``'s ``onPodConditions`` without the ``status`` that
every one of those schemas requires. deploy/README.md says what was and was not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (the dev extra) checks the manifests: pip install -e '.[dev]'"
)

MANIFESTS = sorted((REPO_ROOT / "deploy" / "kubernetes").glob("*.yaml"))
OLDEST = "1.29.0"
"""groups.yaml: 'Needs Kubernetes >= 1.29'."""
VERSIONS = [OLDEST, kubernetes_validate.latest_version()]


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_every_manifest_is_found_and_names_its_kinds() -> None:
    kinds = {d["kind"] for path in MANIFESTS for d in documents(path)}
    assert [p.name for p in MANIFESTS] == ["groups.yaml", "lighthouse-replicated.yaml", "lighthouse.yaml"]
    assert kinds == {"Job", "Deployment", "Service", "StatefulSet"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_api_schema(path: Path, version: str) -> None:
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(
                f"{path.name}: {doc['kind']} {doc['metadata']['name']} is not valid Kubernetes {version}: "
                f"{e.message} at {'.'.join(map(str, e.path))}"
            )


def test_a_broken_manifest_is_caught() -> None:
    (job,) = documents(REPO_ROOT / "deploy" / "kubernetes" / "groups.yaml")
    job["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(job, OLDEST, strict=True)
