from __future__ import annotations

from django.db import models


class Category(models.Model):
    name = models.CharField(max_length=100, unique=True)


class Product(models.Model):
    category = models.ForeignKey(Category, on_delete=models.CASCADE, related_name="products")
    title = models.CharField(max_length=200, db_index=True)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    in_stock = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)
    attrs = models.JSONField(default=dict)
    uid = models.UUIDField(null=True)

    class Meta:
        indexes = [models.Index(fields=["price", "in_stock"])]  # noqa: RUF012 (Django's)
