"""manage.py create_api_key TENANT [--name NAME] [--expires WHEN] [--admin]: prints a new key, once."""
import re
from datetime import datetime, timedelta, timezone as dt_timezone

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from inference.models import ApiKey, Tenant

_RELATIVE = re.compile(r"^(\d+)([dh])$")


def parse_expiry(text: str) -> datetime:
    """An expiry time from "30d" (days from now), "12h" (hours from now), an ISO date (midnight
    UTC that day) or an ISO datetime (UTC when it names no zone)."""
    match = _RELATIVE.match(text.strip())
    if match:
        amount, unit = int(match[1]), match[2]
        return timezone.now() + (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    try:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            moment = datetime(day.year, day.month, day.day) if day else None
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"--expires: {text!r} is not 30d, 12h, YYYY-MM-DD or an ISO datetime")
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, dt_timezone.utc)
    return moment


class Command(BaseCommand):
    help = "Create an API key for a tenant and print it (the only time it is shown)."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's name")
        parser.add_argument("--name", default="", help="a label for people")
        parser.add_argument("--expires", help="30d, 12h, YYYY-MM-DD or an ISO datetime")
        parser.add_argument("--admin", action="store_true",
                            help="an admin key: also accepted by the operator routes (/metrics when "
                                 "protected, adapter loading, model swap)")

    def handle(self, *args, tenant, name, expires, admin, **options):
        try:
            owner = Tenant.objects.get(name=tenant)
        except Tenant.DoesNotExist:
            raise CommandError(f"No tenant named {tenant!r} (create it with create_tenant).")
        expires_at = parse_expiry(expires) if expires else None
        key = ApiKey.objects.create(tenant=owner, name=name, expires_at=expires_at, is_admin=admin)
        self.stderr.write(f"Created {'admin ' if admin else ''}key {key.prefix}… for {owner}"
                          f"{f', expires {expires_at.isoformat()}' if expires_at else ''}. "
                          "It is printed below once and stored only as a hash:")
        if not settings.METRALE["REQUIRE_AUTH"]:
            self.stderr.write(unchecked_key_note(admin))
        self.stdout.write(key.new_key)


def unchecked_key_note(admin: bool) -> str:
    """What a key made while METRALE_REQUIRE_AUTH is off is (not) checked for: the API routes run every request
    as the default tenant then, whatever key it sends; the operator routes check admin keys always
    (tenancy/auth.authenticate_operator)."""
    note = ("Note: METRALE_REQUIRE_AUTH is off, so the API routes check no key: every request runs as the "
            "default tenant, and this key's tenant, limits and expiry apply only once METRALE_REQUIRE_AUTH=1 "
            "(settings_production turns it on).")
    return note + (" As an admin key it is checked now on the operator routes." if admin else "")
