"""Django's ORM against a PostgreSQL-protocol server: ``python run.py PORT``. Migrations (made
and applied, twice), bulk and single inserts, aggregates, annotate, JSON, transactions and
savepoints, a unique violation, iterator() (a WITH HOLD cursor), update, delete and
introspection; prints OK, or fails with the first difference."""

from __future__ import annotations

import decimal
import os
import sys
import tempfile
import uuid

import django
from django.conf import settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
migrations = tempfile.mkdtemp()
open(os.path.join(migrations, "__init__.py"), "w").close()
sys.path.insert(0, os.path.dirname(migrations))
settings.configure(
    INSTALLED_APPS=["django_shop"],
    MIGRATION_MODULES={"django_shop": os.path.basename(migrations)},
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": "127.0.0.1",
            "PORT": sys.argv[1],
            "NAME": "app",
            "USER": "app",
            "OPTIONS": {"server_side_binding": sys.argv[2:] == ["server-side"]},
        }
    },
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import IntegrityError, connection, transaction  # noqa: E402
from django.db.models import Count, F, Q, Sum  # noqa: E402
from django_shop.models import Category, Product  # noqa: E402

call_command("makemigrations", "django_shop", verbosity=0)
call_command("migrate", verbosity=0)
call_command("migrate", verbosity=0)  # (the second finds them applied)

books = Category.objects.create(name="books")
toys = Category.objects.create(name="toys")
Product.objects.bulk_create(
    Product(category=books, title=f"b{i}", price=decimal.Decimal("9.99") + i, attrs={"i": i})
    for i in range(20)
)
ball = Product.objects.create(
    category=toys, title="ball", price=decimal.Decimal("3.50"), in_stock=False, uid=uuid.uuid4()
)
assert Product.objects.count() == 21
assert Product.objects.filter(price__gt=15).count() == 14
named = Category.objects.annotate(n=Count("products")).order_by("name")
assert list(named.values_list("name", "n")) == [("books", 20), ("toys", 1)]
assert Product.objects.aggregate(s=Sum("price"))["s"] == decimal.Decimal("393.30")
found = Product.objects.filter(Q(title__icontains="B1") | Q(in_stock=False)).order_by("-price")
assert list(found[:3].values_list("title", flat=True)) == ["b19", "b18", "b17"]
assert Product.objects.get(title="b3").attrs == {"i": 3}
Product.objects.filter(category=toys).update(price=F("price") * 2)
got = Product.objects.select_related("category").get(pk=ball.pk)
assert (got.category.name, got.price, got.uid) == ("toys", decimal.Decimal("7.00"), ball.uid)

try:
    with transaction.atomic():
        Category.objects.create(name="gone")
        raise RuntimeError("roll back")
except RuntimeError:
    pass
assert not Category.objects.filter(name="gone").exists()
with transaction.atomic(), transaction.atomic():  # (a savepoint inside)
    Category.objects.create(name="kept")
assert Category.objects.filter(name="kept").exists()
try:
    with transaction.atomic():
        Category.objects.create(name="books")
    raise AssertionError("a duplicate name was accepted")
except IntegrityError:
    pass

titles = [p.title for p in Product.objects.order_by("id").iterator(chunk_size=6)]
assert titles == [f"b{i}" for i in range(20)] + ["ball"], titles
Product.objects.filter(title="b0").delete()
assert Product.objects.count() == 20

assert {"django_shop_category", "django_shop_product"} <= set(
    connection.introspection.table_names()
)
with connection.cursor() as cursor:
    columns = connection.introspection.get_table_description(cursor, "django_shop_product")
    assert [c.name for c in columns][:3] == ["id", "title", "price"], columns
    constraints = connection.introspection.get_constraints(cursor, "django_shop_product")
    assert any(c["primary_key"] for c in constraints.values()), constraints
print("OK")
