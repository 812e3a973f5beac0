"""FOCUS 1.0's words and costline's, both ways: service categories, charge categories, and the
columns that become tags.

The import reads a bill with these tables and the export writes costline's buckets with them,
so a bill that goes in and comes back out keeps its groupings. ``docs/FOCUS.md`` shows each
table.
"""

from __future__ import annotations

from costline.rules.events import Category, ChargeKind

# FOCUS 1.0 ServiceCategory → costline category (compared case-insensitively). Unknown values
# count as ``other``.
SERVICE_CATEGORIES: dict[str, Category] = {
    "ai and machine learning": Category.compute,
    "analytics": Category.database,
    "business applications": Category.other,
    "compute": Category.compute,
    "databases": Category.database,
    "developer tools": Category.operations,
    "identity": Category.security,
    "integration": Category.other,
    "internet of things": Category.other,
    "management and governance": Category.observability,
    "media": Category.other,
    "migration": Category.migration,
    "mobile": Category.other,
    "multicloud": Category.operations,
    "networking": Category.network,
    "security": Category.security,
    "storage": Category.storage,
    "web": Category.compute,
    "other": Category.other,
}

# costline category → the FOCUS 1.0 ServiceCategory the export writes: one that the import
# maps back to the same category.
SERVICE_CATEGORY_OF: dict[Category, str] = {
    Category.compute: "Compute",
    Category.storage: "Storage",
    Category.network: "Networking",
    Category.database: "Databases",
    Category.observability: "Management and Governance",
    Category.security: "Security",
    Category.operations: "Developer Tools",
    Category.migration: "Migration",
    Category.other: "Other",
}

# FOCUS 1.0 ChargeCategory, in FOCUS's spelling, by its lower case.
CHARGE_CATEGORIES: dict[str, str] = {
    name.casefold(): name for name in ("Usage", "Purchase", "Tax", "Credit", "Adjustment")
}

# The charge of a row that is not negative, by its ChargeCategory. A positive Credit (a credit
# taken back) stays a credit and adds to gross spend; any negative row other than a credit is
# an adjustment, as only credits, refunds and adjustments may be negative.
_CHARGE_OF: dict[str, ChargeKind] = {
    "usage": ChargeKind.usage,
    "purchase": ChargeKind.purchase,
    "tax": ChargeKind.tax,
    "credit": ChargeKind.credit,
    "adjustment": ChargeKind.adjustment,
}

# costline charge → the FOCUS 1.0 ChargeCategory the export writes for it when the tags do
# not name one. FOCUS 1.0 has no refund: a refund is money given back, a Credit.
CHARGE_CATEGORY_OF: dict[ChargeKind, str] = {
    ChargeKind.usage: "Usage",
    ChargeKind.purchase: "Purchase",
    ChargeKind.tax: "Tax",
    ChargeKind.credit: "Credit",
    ChargeKind.refund: "Credit",
    ChargeKind.adjustment: "Adjustment",
}


def charge_of(category: str | None, negative: bool) -> tuple[ChargeKind, bool]:
    """The charge of a row of ``category`` (its ChargeCategory) and whether that category is
    one FOCUS 1.0 knows. A negative amount is a credit when the row says Credit and an
    adjustment otherwise (a refund, a reversal, a downward correction); an unknown category
    that is not negative counts as usage."""
    name = (category or "").strip().casefold()
    known = name in _CHARGE_OF
    if negative:
        return (ChargeKind.credit if name == "credit" else ChargeKind.adjustment), known
    return _CHARGE_OF.get(name, ChargeKind.usage), known


# FOCUS column → costline tag, in the order they claim one of the 32 tag places. The export
# writes each tag back to its column.
COLUMN_TAGS: tuple[tuple[str, str], ...] = (
    ("ProviderName", "provider"),
    ("ServiceName", "service"),
    ("SubAccountId", "sub_account"),
    ("SubAccountName", "sub_account_name"),
    ("BillingAccountId", "billing_account"),
    ("RegionId", "region"),
    ("ChargeCategory", "charge_category"),
    ("ChargeClass", "charge_class"),
)

# The tag a row converted from another currency carries: that currency.
CURRENCY_TAG = "billing_currency"


# FOCUS 1.0 ChargeFrequency of the charges whose amount accrues over their period (compared
# case-insensitively); a row that does not say is taken as one.
ACCRUING = "usage-based"


def accrues(frequency: str | None) -> bool:
    """A usage-based charge: its amount grows until its charge period ends."""
    return (frequency or ACCRUING).strip().casefold() == ACCRUING
