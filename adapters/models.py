"""The operators' model objects: Adapter (a LoRA adapter folder: name, path, loaded, requests served, tenant
allow-list), ServedModel (a swap of the default chat model), ModelSetting (an operator's pin / keep_alive of
a configured model)."""
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
    """The default chat model every replica serves in place of its configured one: one row (pk 1), written
    by `manage.py swap_model` or the admin. A server follows it (adapters.swap_watch) only while its
    configured default chat model is the one the swap replaced (`configured`); it reports how its swap
    went here."""

    STATES = [(s, s) for s in ("pending", "loading", "serving", "failed")]

    path = models.CharField(max_length=1000, help_text="An HF model folder on the servers.")
    served_name = models.CharField(max_length=200, blank=True, help_text="The `model` id (blank: the folder's name).")
    configured = models.CharField(max_length=1000, blank=True, help_text=(
        "The configured default chat model (its source) this swap replaces: a server configured with another "
        "default serves its configuration and ignores this swap (logged)."))
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


class ModelSetting(models.Model):
    """An operator's settings of one configured model (by served name): pinned (loaded, never unloaded) and
    keep_alive, over the configuration's (METRALE_PIN, METRALE_KEEP_ALIVE / METRALE_MODEL_KEEP_ALIVE). Blank
    means "as configured". Which models exist is the configuration's alone; every server sharing the
    database applies a row to its model of that name at start and when the row is saved in the admin."""

    name = models.CharField(max_length=200, unique=True, help_text="The model's served name.")
    pinned = models.BooleanField(null=True, blank=True, help_text="Blank: as configured (METRALE_PIN).")
    keep_alive = models.CharField(max_length=40, blank=True, help_text=(
        'Ollama\'s keep_alive: "5m", seconds, 0 (unload once idle), -1 (never). Blank: as configured.'))
    updated = models.DateTimeField(auto_now=True)
    # `manage.py models load|unload NAME` asks the servers here; each server's watcher runs it, clears it,
    # and reports its model's state in the fields below (swap_watch.report_models).
    command = models.CharField(max_length=10, blank=True, choices=[("load", "load"), ("unload", "unload")])
    state = models.CharField(max_length=20, blank=True, help_text="As the last server to report saw it.")
    error = models.TextField(blank=True)
    resident_bytes = models.BigIntegerField(null=True, blank=True)
    reported = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"

    def __str__(self):
        return self.name
