"""A per-domain deployment: each domain's backend, the checks of its URLs, and the routing of a
request's text to a domain.

It reads deployment files (TOML) and ``specscope export`` documents (JSON); it does not serve
requests (:mod:`.proxy`) or write logs (:mod:`.logs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import StringConstraints

from ...errors import SpecscopeError
from ...files import read_json_object, read_toml_table
from ...schemas import INPUT, parse
from ...tune.router import Rule, RuleRouter, prompt_text
from ..ingest.formats import FORMATS

# the engines the gateway can stand in front of (those whose answers carry per-request statistics),
# and the key of those statistics in an answer (the event to keep from a stream): each engine's
# ingest format says it
ENGINE_STATS_KEY: dict[str, str] = {
    name: fmt.stats_key for name, fmt in FORMATS.items() if fmt.stats_key is not None
}


class DeploymentError(SpecscopeError, ValueError):
    """A deployment file that cannot be served; the message names the field and what is allowed."""


def _redact(parts) -> str:
    """A URL's text with its userinfo (credentials) replaced by ``***``."""
    if parts.username is None and parts.password is None:
        return urlunsplit(parts)
    netloc = "***@" + parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Backend:
    """Where one domain's requests go: a deployment file's ``[fallback]`` or ``[domains.NAME]``
    table (its schema, :mod:`specscope.schemas`)."""

    __pydantic_config__ = INPUT

    url: str  # base URL of the engine's server, e.g. http://127.0.0.1:8080 (credentials included)
    model: str | None = None  # the body's ``model`` to set (llama-server router: the preset name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_backend_url(self.url, ""))
        if self.model is not None and not self.model:
            raise DeploymentError(
                "model must be a non-empty string (the preset or model name the engine serves)"
            )

    @property
    def display(self) -> str:
        """The URL as shown anywhere (health, logs, messages): credentials replaced by ``***``."""
        return _redact(urlsplit(self.url))

    @property
    def name(self) -> str:
        return self.display + (f" (model {self.model!r})" if self.model else "")

    def redact(self, text: str) -> str:
        """``text`` (an error message) with this backend's URL and credentials shown as
        :attr:`display` shows them."""
        userinfo, at, _ = urlsplit(self.url).netloc.rpartition("@")
        text = text.replace(self.url, self.display)
        return text.replace(userinfo + at, "***@") if at else text


@dataclass(frozen=True)
class DeploymentFile:
    """A deployment file (TOML, docs/gateway.md): the engine, the fallback's backend and each
    domain's."""

    __pydantic_config__ = INPUT

    fallback: Backend  # the backend of any prompt whose domain has no table of its own
    engine: str = "llama.cpp"
    domains: dict[Annotated[str, StringConstraints(min_length=1)], Backend] = field(
        default_factory=dict
    )
    # /metrics also under vLLM's names (vllm:spec_decode_num_drafts, ...): for vLLM's dashboards
    # where no vLLM's own /metrics is scraped beside the gateway's (else each count twice)
    vllm_compatible_metrics: bool = False


@dataclass(frozen=True)
class Deployment:
    """Each domain's backend, the fallback's, and the engine whose statistics the log keeps;
    ``vllm_compatible_metrics``: ``/metrics`` also under vLLM's names."""

    engine: str
    domains: Mapping[str, Backend]
    fallback: Backend
    router: RuleRouter = field(default_factory=RuleRouter)
    vllm_compatible_metrics: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_STATS_KEY:
            raise DeploymentError(
                f"engine {self.engine!r} is not one the gateway logs for; "
                f"allowed: {', '.join(ENGINE_STATS_KEY)}"
            )
        produced = routable_domains(self.router)
        for domain in self.domains:
            if domain not in produced:
                raise DeploymentError(
                    f"domain {domain!r}: specscope's router never routes to it (it produces "
                    f"{', '.join(produced)}); remove it or name one of those"
                )

    def route(self, text: str) -> tuple[str, Backend]:
        """The domain of a prompt and the backend that serves it."""
        domain = self.router.classify(text)
        return domain, self.domains.get(domain, self.fallback)

    def backend_urls(self) -> tuple[str, ...]:
        """Each distinct backend URL, once."""
        return tuple(dict.fromkeys(b.url for b in (*self.domains.values(), self.fallback)))

    def backends(self) -> tuple[Backend, ...]:
        """Each distinct backend (URL and model), once: the domains' in order, the fallback's
        last."""
        return tuple(dict.fromkeys((*self.domains.values(), self.fallback)))

    @classmethod
    def from_table(cls, table: Mapping, where: str = "deployment") -> Deployment:
        """From a deployment table: ``engine``, ``[fallback]`` and ``[domains.NAME]`` tables of
        ``url`` and optional ``model``, and ``vllm_compatible_metrics`` (:class:`DeploymentFile`,
        see docs/gateway.md)."""
        read = parse(DeploymentFile, table, where, DeploymentError)
        return cls(
            read.engine,
            read.domains,
            read.fallback,
            vllm_compatible_metrics=read.vllm_compatible_metrics,
        )

    @classmethod
    def from_export(
        cls, document: Mapping, backends: Mapping[str, str], where: str = "export"
    ) -> Deployment:
        """From a ``specscope export`` document: its engine, its routing rule (the gateway
        routes exactly as exported) and each domain's ``model`` (llama.cpp: the preset named
        after the domain). ``backends``: domain -> base URL, ``"*"`` for every domain not named
        (one llama-server in router mode serves them all); a domain the document does not have
        is refused."""
        engine, domains = document.get("engine"), document.get("domains")
        if not isinstance(domains, Mapping) or not domains:
            raise DeploymentError(f"{where}: not a specscope export document (no 'domains')")
        router = _router(document.get("routing"), where)
        known = [str(d) for d in domains] + (["fallback"] if "fallback" in document else [])
        for domain, url in backends.items():
            check_backend_url(url, f"--url {domain}")
            if domain != "*" and domain not in known:
                raise DeploymentError(
                    f"--url {domain}=...: {where} has no domain {domain!r}; "
                    f"allowed: {', '.join(known)} (or --url URL for all)"
                )

        def backend(domain: str, entry) -> Backend:
            url = backends.get(domain, backends.get("*"))
            if url is None:
                raise DeploymentError(
                    f"{where}: no backend URL for domain {domain!r}; pass "
                    f"--url {domain}=URL (or --url URL for all)"
                )
            model = entry.get("model") if isinstance(entry, Mapping) else None
            if model is None and engine == "llama.cpp":
                model = domain  # the router-mode preset is named after its domain
            entry = {"url": url, **({"model": model} if model is not None else {})}
            return parse(Backend, entry, f"{where}: domains.{domain}", DeploymentError)

        named = {str(d): backend(str(d), e) for d, e in domains.items()}
        # the router's fallback domain is itself a domain of the export: its backend serves
        # prompts no rule claims
        if router.fallback in named:
            fallback = named[router.fallback]
        elif "fallback" in document:
            fallback = backend("fallback", document["fallback"])
        else:
            raise DeploymentError(
                f"{where}: no setting for the router's fallback domain {router.fallback!r}"
            )
        return cls(engine if isinstance(engine, str) else "", named, fallback, router)

    @classmethod
    def load(cls, path: str | Path, backends: Mapping[str, str] | None = None) -> Deployment:
        """A deployment file (TOML), or an export document (JSON) with ``backends``."""
        if Path(path).suffix == ".json":
            return cls.from_export(
                read_json_object(path, DeploymentError, "export document"),
                backends or {},
                str(path),
            )
        if backends:
            raise DeploymentError(
                f"{path}: a deployment file names its backends itself; "
                "--url is for an export document (JSON)"
            )
        return cls.from_table(read_toml_table(path, DeploymentError, "deployment file"), str(path))


def _router(routing, where: str) -> RuleRouter:
    """The router an export document's routing rule describes (specscope's by default); a rule
    whose pattern does not compile, or a weight or threshold that is not finite, is refused
    (the router's own checks, :class:`~specscope.tune.router.RouterError`)."""
    if routing is None:
        return RuleRouter()
    try:
        rules = tuple(
            Rule(str(r["domain"]), str(r["pattern"]), float(r["weight"])) for r in routing["rules"]
        )
        return RuleRouter(rules, float(routing["threshold"]), str(routing["fallback"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DeploymentError(
            f"{where}: routing rule unreadable (missing or bad {e}); export the policy again"
        ) from None


def routable_domains(router: RuleRouter) -> tuple[str, ...]:
    """The domains ``router`` can produce: those its rules score, and its fallback."""
    return tuple(dict.fromkeys([*(r.domain for r in router.rules), router.fallback]))


def check_backend_url(url, where: str) -> str:
    """``url`` without a trailing slash if it is a base URL the gateway can forward to: http or
    https, a host, a port in 1..65535 if one is given, no query, fragment, whitespace or control
    character, at most one ``@``; else a :class:`DeploymentError` naming what is wrong (after
    ``where: `` where given)."""
    at = f"{where}: " if where else ""
    if not isinstance(url, str):
        raise DeploymentError(f"{at}url must be a string, got {url!r}")
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise DeploymentError(f"{at}url is not a URL ({e})") from None
    shown = repr(_redact(parts))  # urlsplit drops tabs and line breaks: the check is on url
    bad = next((c for c in url if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise DeploymentError(
            f"{at}url {shown} holds the character {bad!r}; "
            "write it without spaces or control characters (percent-encode them)"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeploymentError(
            f"{at}url must be an http:// or https:// base URL with a host, got {shown}"
        )
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise DeploymentError(
            f"{at}url {shown} has a query or fragment; a base URL has neither "
            "(the request's own path is appended to it)"
        )
    if parts.netloc.count("@") > 1:
        raise DeploymentError(
            f"{at}url {shown} holds '@' more than once; percent-encode '@' in credentials"
        )
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.rpartition("@")[2].endswith(":")):
        raise DeploymentError(f"{at}url {shown}: the port must be a number in 1..65535")
    return url.rstrip("/")


def request_text(body: Mapping) -> str:
    """The text to classify: the user turns of a chat request, or a completion's prompt (a
    string or a list of strings; token ids are no text and classify as the fallback)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return prompt_text([m for m in messages if isinstance(m, Mapping)])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n\n".join(p for p in prompt if isinstance(p, str))
    return ""
