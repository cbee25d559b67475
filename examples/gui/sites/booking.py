"""A restaurant's table booking: a form checked on the server, a confirmation with a code, free tables, cancelling.

Data (a task's `data`):

    {"title": "Lakeside Bistro", "today": "2026-03-02", "phone": "020 7946 0000",
     "times": ["17:30", "18:00", "18:30"], "max_party": 8, "days_ahead": 60, "capacity": 4,
     "closed_weekdays": ["Tuesday"], "closed_dates": ["2026-03-20"],
     "full": [{"date": "2026-03-07", "time": "20:00"}], "code_seed": 7,
     "bookings": [{"id": "b-1", "code": "LB-4M2X", "date": "2026-03-05", "time": "19:00", "party": 2,
                   "name": "Ben Carter", "email": "ben@example.com", "notes": "", "status": "confirmed"}]}

A slot (a date and a time) is fully booked when `full` lists it or when it holds `capacity`
confirmed bookings. The rules: a date written YYYY-MM-DD, from today to `days_ahead` days ahead,
not a closed day; a time of `times`, in a slot with room; a party of 1 to `max_party`; a name; an
email address. A booking's code is made from `code_seed` and a counter (the same requests give the
same codes). State: `bookings` (`code`, `date`, `time`, `party`, `name`, `email`, `notes`,
`status`: confirmed or cancelled).
"""

from __future__ import annotations

import datetime
import re

from orchard.recipes.gui.site import (
    Refused,
    Response,
    Site,
    errors_box,
    esc,
    form,
    hidden,
    route,
    row,
    select,
    text_field,
    textarea,
)

EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
CODE_LETTERS = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
MAX_NOTES = 500


def spoken(day: datetime.date) -> str:
    """`Friday 6 March 2026`."""
    return f"{WEEKDAYS[day.weekday()]} {day.day} {MONTHS[day.month - 1]} {day.year}"


class Booking(Site):
    name = "booking"
    title = "Lakeside Bistro"
    collections = ("bookings",)

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.today = datetime.date.fromisoformat(str(self.data.get("today", "2026-03-02")))
        self.times = [
            str(t) for t in self.data.get("times") or ["18:00", "18:30", "19:00", "19:30", "20:00", "20:30", "21:00"]
        ]
        self.max_party = int(self.data.get("max_party", 8))
        self.days_ahead = int(self.data.get("days_ahead", 60))
        self.capacity = int(self.data.get("capacity", 4))
        self.closed_weekdays = [str(d).capitalize() for d in self.data.get("closed_weekdays", [])]
        self.closed_dates = [str(d) for d in self.data.get("closed_dates", [])]
        self.full = {(str(s["date"]), str(s["time"])) for s in self.data.get("full", [])}
        self.phone = str(self.data.get("phone", "020 7946 0000"))
        self.seed = int(self.data.get("code_seed", 1))
        for booking in self.records["bookings"]:
            if not booking.get("code") or not booking.get("date"):
                raise ValueError("booking's data: every booking needs a `code` and a `date`")
            booking.setdefault("status", "confirmed")

    def nav(self) -> list:
        return [("/", "Book a table"), ("/availability", "Free tables"), ("/manage", "Your booking")]

    # The rules.

    def _day(self, text: str) -> tuple:
        """(date, why not) of a date the form names."""
        if not DATE.fullmatch(text):
            return None, "Enter the date as YYYY-MM-DD, for example 2026-03-14."
        try:
            day = datetime.date.fromisoformat(text)
        except ValueError:
            return None, f"{text} is not a date in the calendar."
        if day < self.today:
            return None, f"{text} is in the past: choose today ({self.today.isoformat()}) or a later date."
        if (day - self.today).days > self.days_ahead:
            return (
                None,
                f"We take bookings up to {self.days_ahead} days ahead: choose a date before {(self.today + datetime.timedelta(days=self.days_ahead + 1)).isoformat()}.",
            )
        if WEEKDAYS[day.weekday()] in self.closed_weekdays:
            return None, f"We are closed on {WEEKDAYS[day.weekday()]}s: choose another day."
        if text in self.closed_dates:
            return None, f"We are closed on {spoken(day)}: choose another day."
        return day, ""

    def _taken(self, date: str, time: str) -> bool:
        booked = sum(
            1
            for b in self.records["bookings"]
            if b.get("date") == date and b.get("time") == time and b.get("status") == "confirmed"
        )
        return (date, time) in self.full or booked >= self.capacity

    def _free(self, date: str) -> list:
        return [t for t in self.times if not self._taken(date, t)]

    def _code(self) -> str:
        """A new booking code, `LB-` and four letters or digits, made from the seed and the counter."""
        taken = {str(b.get("code")) for b in self.records["bookings"]}
        while True:
            self.counter += 1
            mixed = ((self.seed * 1_000_003 + self.counter * 7_919) * 2_654_435_761) % (1 << 32)
            letters = ""
            for _ in range(4):
                mixed, digit = divmod(mixed, len(CODE_LETTERS))
                letters += CODE_LETTERS[digit]
            if f"LB-{letters}" not in taken:
                return f"LB-{letters}"

    # Booking.

    FIELDS = ("date", "time", "party", "name", "email", "notes")

    def _form_page(self, values: dict, errors: dict, status: int = 200) -> Response:
        closed = f" except {', '.join(d + 's' for d in self.closed_weekdays)}" if self.closed_weekdays else ""
        fields = (
            row(
                text_field("Date", "date", values.get("date", ""), errors=errors, hint="(YYYY-MM-DD)", size=12),
                select("Time", "time", self.times, values.get("time", ""), errors=errors, prompt="Choose a time"),
                text_field("Number of people", "party", values.get("party", "2"), errors=errors, kind="number"),
            )
            + row(
                text_field("Your name", "name", values.get("name", ""), errors=errors),
                text_field("Email", "email", values.get("email", ""), errors=errors, kind="email"),
            )
            + textarea("Notes for the restaurant", "notes", values.get("notes", ""), errors=errors, rows=3)
        )
        intro = (
            f"<p>Open every evening{closed}: tables from {esc(self.times[0])}, the last at {esc(self.times[-1])}."
            f" We take bookings for up to {self.max_party} people here; for larger groups, call us on {esc(self.phone)}."
            f' Already booked? <a href="/manage">Find or cancel your booking</a>.</p>'
        )
        return self.page(
            "Book a table",
            f"{errors_box(errors)}{intro}{form('/book', fields, button='Book a table', button_id='book')}",
            status=status,
        )

    @route("GET", "/")
    def home(self, request) -> Response:
        return self._form_page({}, {})

    @route("POST", "/book")
    def book(self, request) -> Response:
        values = {name: request.value(name) for name in self.FIELDS}
        errors: dict = {}
        day, why = self._day(values["date"])
        if why:
            errors["date"] = why
        if values["time"] not in self.times:
            errors["time"] = "Choose a time from the list."
        elif day is not None and self._taken(values["date"], values["time"]):
            free = self._free(values["date"])
            others = f" Free times that day: {', '.join(free)}." if free else " That day is fully booked."
            errors["time"] = f"{values['time']} on {spoken(day)} is fully booked.{others}"
        party = values["party"]
        if not party.isdigit() or not 1 <= int(party) <= self.max_party:
            errors["party"] = (
                f"We take bookings for 1 to {self.max_party} people online; for a larger group, call us on {self.phone}."
            )
        if not values["name"]:
            errors["name"] = "Enter the name for the booking."
        if not EMAIL.fullmatch(values["email"]):
            errors["email"] = "Enter an email address like name@example.com."
        if len(values["notes"]) > MAX_NOTES:
            errors["notes"] = f"Notes hold at most {MAX_NOTES} characters."
        if errors:
            return self._form_page(values, errors, 422)
        self.room("bookings")
        code = self._code()
        self.records["bookings"].append(
            {
                "id": f"b-{self.counter:04d}",
                "code": code,
                **{name: values[name] for name in ("date", "time", "name", "email", "notes")},
                "party": int(party),
                "status": "confirmed",
            }
        )
        return Response.redirect(f"/booking/{code}")

    def _details(self, booking: dict) -> str:
        day = datetime.date.fromisoformat(str(booking["date"]))
        rows = (
            f'<tr><th>Booking code</th><td id="booking-code"><strong>{esc(booking["code"])}</strong></td></tr>'
            f"<tr><th>Date</th><td>{esc(spoken(day))}</td></tr><tr><th>Time</th><td>{esc(booking.get('time', ''))}</td></tr>"
            f"<tr><th>People</th><td>{esc(booking.get('party', ''))}</td></tr><tr><th>Name</th><td>{esc(booking.get('name', ''))}</td></tr>"
            f"<tr><th>Email</th><td>{esc(booking.get('email', ''))}</td></tr><tr><th>Notes</th><td>{esc(booking.get('notes', ''))}</td></tr>"
            f'<tr><th>Status</th><td id="status">{esc(booking.get("status", ""))}</td></tr>'
        )
        cancel = ""
        if booking.get("status") == "confirmed" and day >= self.today:
            cancel = form(
                "/cancel",
                hidden("code", booking["code"]),
                button="Cancel this booking",
                button_id="cancel",
                danger=True,
            )
        return f"<table>{rows}</table><p></p>{cancel}"

    @route("GET", "/booking/{code}")
    def confirmation(self, request, code: str) -> Response:
        booking = self.find("bookings", code, key="code")
        if booking is None:
            raise Refused(404, f"No booking has the code {code}.")
        if booking.get("status") == "cancelled":
            notice = f'<p class="notice">Booking {esc(code)} is cancelled.</p>'
        else:
            notice = f'<p class="notice">Your table is booked. Your booking code is <strong>{esc(code)}</strong>: keep it to find or cancel the booking.</p>'
        return self.page("Your booking", notice + self._details(booking))

    # Finding, cancelling, free tables.

    @route("GET", "/manage")
    def manage(self, request) -> Response:
        code = request.value("code").upper()
        lookup = form(
            "/manage",
            text_field("Booking code", "code", code, size=10),
            button="Find booking",
            button_id="find",
            method="get",
        )
        found = ""
        if code:
            booking = self.find("bookings", code, key="code")
            found = (
                self._details(booking)
                if booking
                else f'<p class="errors">No booking has the code {esc(code)}. Check the code in your confirmation.</p>'
            )
        return self.page("Find your booking", lookup + found)

    @route("POST", "/cancel")
    def cancel(self, request) -> Response:
        code = request.value("code").upper()
        booking = self.find("bookings", code, key="code")
        if booking is None:
            raise Refused(404, f"No booking has the code {code}.")
        if booking.get("status") == "cancelled":
            raise Refused(422, f"Booking {code} is cancelled already.")
        if datetime.date.fromisoformat(str(booking["date"])) < self.today:
            raise Refused(422, f"Booking {code} was for a day in the past: it cannot be cancelled.")
        booking["status"] = "cancelled"
        return Response.redirect(f"/booking/{code}")

    @route("GET", "/availability")
    def availability(self, request) -> Response:
        date = request.value("date")
        lookup = form(
            "/availability",
            text_field("Date", "date", date, hint="(YYYY-MM-DD)", size=12),
            button="Show free tables",
            button_id="show",
            method="get",
        )
        found = ""
        if date:
            day, why = self._day(date)
            if why:
                found = f'<p class="errors">{esc(why)}</p>'
            else:
                rows = "".join(
                    f"<tr><td>{esc(t)}</td><td>{'fully booked' if self._taken(date, t) else 'free'}</td></tr>"
                    for t in self.times
                )
                found = (
                    f'<h2>{esc(spoken(day))}</h2><table id="slots"><tr><th>Time</th><th>Tables</th></tr>{rows}</table>'
                )
        return self.page("Free tables", lookup + found)
