"""Adapter: a LoRA adapter folder the operators serve (name, path, loaded, requests served, tenant allow-list)."""
from django.db import models


class Adapter(models.Model):
    """A LoRA adapter requests select by `name` (their `model`). `loaded`: resident in this server's
    engine (a row loaded at run time, by the admin or at startup, is loaded again when a server
    starts). `tenants`: the tenants that may use it; none listed: every tenant. Server-wide, not
    tenant data."""

    name = models.CharField(max_length=200, unique=True, help_text="The `model` name requests use.")
    path = models.CharField(max_length=1000, help_text="A PEFT LoRA folder on the server.")
    loaded = models.BooleanField(default=False)
    requests_served = models.PositiveBigIntegerField(default=0)
    tenants = models.ManyToManyField("inference.Tenant", blank=True, related_name="adapters",
                                     help_text="Only these tenants may use it (none: every tenant).")
    error = models.TextField(blank=True, help_text="Why the last load failed.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def allowed_salts(self) -> frozenset[str] | None:
        """The prefix-cache salts of the tenants allowed (None: every tenant)."""
        tenants = list(self.tenants.all())
        return frozenset(t.prefix_cache_salt for t in tenants) if tenants else None


class ServedModel(models.Model):
    """The model every replica serves: one row (pk 1), written by `manage.py swap_model` or the
    admin. Each server follows it (adapters.swap_watch) and reports how its swap went here."""

    STATES = [(s, s) for s in ("pending", "loading", "serving", "failed")]

    path = models.CharField(max_length=1000, help_text="An HF model folder on the servers.")
    served_name = models.CharField(max_length=200, blank=True, help_text="The `model` id (blank: the folder's name).")
    requested = models.DateTimeField(auto_now=True)
    state = models.CharField(max_length=10, choices=STATES, default="pending")
    error = models.TextField(blank=True)
    fingerprint = models.CharField(max_length=40, blank=True)

    class Meta:
        verbose_name = "served model"

    def __str__(self):
        return self.served_name or self.path

    @property
    def name(self) -> str:
        from pathlib import Path

        return self.served_name or Path(self.path).name
