"""The test cluster's certificates and kubeconfig (made with `cryptography`, ECDSA P-256).

``write_pki(folder)`` writes: ca.crt/ca.key (the cluster CA), apiserver.crt/.key (serving cert
for localhost, 127.0.0.1 and the ``kubernetes`` Service names/ClusterIP 10.96.0.1),
admin.crt/.key (client cert, group system:masters: every component and test uses it),
sa.key/sa.pub (service-account token signing). Valid from 5 minutes ago for 365 days.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

# names and addresses the API server certificate is valid for (in-cluster clients use the Service)
APISERVER_DNS = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"]
APISERVER_IPS = ["127.0.0.1", "10.96.0.1"]


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write_key(pki: Path, key, name: str) -> None:
    from cryptography.hazmat.primitives import serialization

    (pki / name).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    os.chmod(pki / name, 0o600)


def _write_cert(pki: Path, cert, name: str) -> None:
    from cryptography.hazmat.primitives import serialization

    (pki / name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return now, now + datetime.timedelta(days=365)


def _write_ca(pki: Path):
    """Self-signed CA; returns (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    ca_key = _key()
    start, end = _validity()
    usage = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False)
    ca = (x509.CertificateBuilder().subject_name(_name("pipectl-test-ca"))
          .issuer_name(_name("pipectl-test-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(usage, critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write_cert(pki, ca, "ca.crt")
    _write_key(pki, ca_key, "ca.key")
    return ca, ca_key


def _write_leaf(pki: Path, ca, ca_key, fname: str, cn: str, org: str | None = None, server: bool = False) -> None:
    """``<fname>.crt``/``.key`` signed by the CA: a server cert (SANs above) or a client cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    k = _key()
    start, end = _validity()
    purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    b = (x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(ca.subject)
         .public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False))
    if server:
        sans = [x509.DNSName(n) for n in APISERVER_DNS] + [x509.IPAddress(ipaddress.ip_address(a))
                                                          for a in APISERVER_IPS]
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write_cert(pki, b.sign(ca_key, hashes.SHA256()), f"{fname}.crt")
    _write_key(pki, k, f"{fname}.key")


def write_pki(pki: Path) -> None:
    """CA, API server serving cert, admin client cert (system:masters), service-account key pair."""
    from cryptography.hazmat.primitives import serialization

    pki.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _write_ca(pki)
    _write_leaf(pki, ca, ca_key, "apiserver", "kube-apiserver", server=True)
    _write_leaf(pki, ca, ca_key, "admin", "pipectl-admin", org="system:masters")
    sa = _key()
    _write_key(pki, sa, "sa.key")
    (pki / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    """A kubeconfig (context ``pipectl-test``, namespace default) with the admin client cert."""
    import yaml

    kc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "pipectl-test",
        "clusters": [{"name": "pipectl-test", "cluster": {
            "server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": "admin", "user": {
            "client-certificate": str(pki / "admin.crt"),
            "client-key": str(pki / "admin.key")}}],
        "contexts": [{"name": "pipectl-test", "context": {
            "cluster": "pipectl-test", "user": "admin", "namespace": "default"}}],
    }
    path.write_text(yaml.safe_dump(kc))
