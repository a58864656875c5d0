"""manage.py create_tenant NAME [--rpm N] [--tpm N] [--concurrency N] ...: a tenant and its limits."""
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from inference.models import RateLimitContext, Tenant
from inference.tenancy.ratelimiting.limits import default_limits


class Command(BaseCommand):
    help = ("Create a tenant with tenant-wide rate limits (each limit defaults to the server's "
            "METRALE_RATE_LIMIT_* value; 0 means unlimited).")

    def add_arguments(self, parser):
        defaults = default_limits()
        parser.add_argument("name")
        parser.add_argument("--rpm", type=int, default=defaults.requests_per_minute,
                            help="requests per minute")
        parser.add_argument("--tpm", type=int, default=defaults.tokens_per_minute,
                            help="prompt + completion tokens per minute")
        parser.add_argument("--burst-rpm", type=int, default=defaults.burst_requests,
                            help="requests bucket size (default: --rpm)")
        parser.add_argument("--burst-tpm", type=int, default=defaults.burst_tokens,
                            help="tokens bucket size (default: --tpm)")
        parser.add_argument("--concurrency", type=int,
                            default=defaults.max_concurrent_requests,
                            help="generating requests in flight at once")
        parser.add_argument("--max-tokens-per-request", type=int,
                            default=defaults.max_tokens_per_request,
                            help="prompt + max_tokens of one request")

    def handle(self, *args, name, rpm, tpm, burst_rpm, burst_tpm, concurrency,
               max_tokens_per_request, **options):
        values = {"--rpm": rpm, "--tpm": tpm, "--burst-rpm": burst_rpm, "--burst-tpm": burst_tpm,
                  "--concurrency": concurrency, "--max-tokens-per-request": max_tokens_per_request}
        for flag, value in values.items():
            if value is not None and value < 0:
                raise CommandError(f"{flag} must be >= 0")
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"A tenant named {name!r} already exists.")
        with transaction.atomic():
            tenant = Tenant.objects.create(name=name)
            RateLimitContext.objects.create(
                tenant=tenant, requests_per_minute=rpm, tokens_per_minute=tpm,
                burst_requests=burst_rpm, burst_tokens=burst_tpm,
                max_concurrent_requests=concurrency, max_tokens_per_request=max_tokens_per_request)
        self.stdout.write(f"Created tenant {name!r} (id {tenant.pk}): rpm {rpm}, tpm {tpm}, "
                          f"concurrency {concurrency} (0 = unlimited).")
