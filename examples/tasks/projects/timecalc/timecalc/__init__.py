"""timecalc - durations, business days and recurring schedules."""

from .dates import add_months, as_date, days_in_month, parse_weekday, week_start, weeks_between
from .durations import DurationError, format_duration, parse_duration
from .expr import ExprError, resolve
from .recurrence import Schedule, parse_schedule
from .workdays import BusinessCalendar

__version__ = "1.0"

__all__ = [
    "BusinessCalendar", "DurationError", "ExprError", "Schedule", "add_months",
    "as_date", "days_in_month", "format_duration", "parse_duration", "parse_schedule",
    "parse_weekday", "resolve", "week_start", "weeks_between",
]
