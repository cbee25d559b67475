"""A team wiki: pages with titles and bodies, search, view, edit with a summary, history, restore, new pages.

Data (a task's `data`):

    {"title": "Harbor Team Wiki", "today": "2026-03-02", "user": "you",
     "pages": [{"id": "main-page", "title": "Main Page", "body": "...", "updated": "2026-02-01", "author": "dana"}],
     "revisions": [{"id": "rev-1", "page": "main-page", "number": 1, "body": "...", "summary": "Created",
                    "author": "dana", "date": "2026-02-01"}]}

A page's `id` is its slug (its title in lower case, words joined by `-`), and `/wiki/<slug>` shows
it. A body is plain text: a blank line between paragraphs, `== Heading ==`, `- ` list items, and
`[[Title]]` or `[[Title|text]]` links to other pages. Fixture pages without revisions get a first
one. State: `pages` (`title`, `body`, `updated`, `author`) and `revisions` (each save: `page`,
`number`, `body`, `summary`, `author`, `date`; a restore is a new revision too).
"""

from __future__ import annotations

import re

from orchard.recipes.gui.site import Refused, Response, Site, errors_box, esc, form, hidden, route, text_field, textarea

LINK = re.compile(r"\[\[([^\]|]+)(?:\|([^\]]+))?\]\]")
MAX_BODY = 20000
MAX_TITLE = 100
MAX_SUMMARY = 200


def slug(title: str) -> str:
    """A title's page id: lower case ASCII letters and digits, words joined by `-`."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


class Wiki(Site):
    name = "wiki"
    title = "Team Wiki"
    collections = ("pages", "revisions")
    search = "/search"
    search_hint = "Search the wiki"

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.today = str(self.data.get("today", "2026-03-02"))
        self.user = str(self.data.get("user", "you"))
        for page in self.records["pages"]:
            if not isinstance(page.get("id"), str) or not page.get("title"):
                raise ValueError("wiki's data: every page needs a string `id` (its slug) and a `title`")
            page.setdefault("body", "")
            if not self._revisions(page["id"]):
                self.records["revisions"].append(
                    {
                        "id": f"rev-{page['id']}-1",
                        "page": page["id"],
                        "number": 1,
                        "body": page["body"],
                        "summary": "Created page",
                        "author": page.get("author", "wiki"),
                        "date": page.get("updated", self.today),
                    }
                )

    def nav(self) -> list:
        return [("/pages", "All pages"), ("/recent", "Recent changes"), ("/new", "Create a page")]

    def _revisions(self, page_id: str) -> list:
        return sorted(
            (r for r in self.records["revisions"] if r.get("page") == page_id), key=lambda r: int(r["number"])
        )

    def _page(self, page_id: str) -> dict:
        page = self.find("pages", page_id)
        if page is None:
            raise Refused(404, f"There is no page {page_id!r} yet.")
        return page

    def _render(self, body: str) -> str:
        """A body's text as HTML (see the module's docstring)."""

        def inline(text: str) -> str:
            out, at = "", 0
            for link in LINK.finditer(text):
                target, label = link.group(1).strip(), (link.group(2) or link.group(1)).strip()
                known = self.find("pages", slug(target)) is not None
                href = f"/wiki/{slug(target)}" if known else f"/new?title={esc(target)}"
                out += (
                    esc(text[at : link.start()]) + f'<a href="{href}"{"" if known else " class=new"}>{esc(label)}</a>'
                )
                at = link.end()
            return out + esc(text[at:])

        html = ""
        for block in re.split(r"\n\s*\n", body.strip()):
            lines = [line.strip() for line in block.splitlines() if line.strip()]
            if not lines:
                continue
            if len(lines) == 1 and lines[0].startswith("==") and lines[0].endswith("=="):
                html += f"<h2>{inline(lines[0].strip('= '))}</h2>"
            elif all(line.startswith("- ") for line in lines):
                html += "<ul>" + "".join(f"<li>{inline(line[2:])}</li>" for line in lines) + "</ul>"
            else:
                html += "<p>" + "<br>".join(inline(line) for line in lines) + "</p>"
        return html

    # Reading.

    @route("GET", "/")
    def home(self, request) -> Response:
        if self.find("pages", "main-page") is not None:
            return self.view(request, "main-page")
        return self.all_pages(request)

    @route("GET", "/pages")
    def all_pages(self, request) -> Response:
        items = "".join(
            f'<li><a href="/wiki/{esc(p["id"])}">{esc(p["title"])}</a></li>'
            for p in sorted(self.records["pages"], key=lambda p: str(p["title"]).lower())
        )
        return self.page("All pages", f"<ul>{items}</ul>")

    @route("GET", "/recent")
    def recent(self, request) -> Response:
        latest = sorted(
            self.records["revisions"], key=lambda r: (str(r.get("date", "")), int(r["number"])), reverse=True
        )[:20]
        titles = {p["id"]: p["title"] for p in self.records["pages"]}
        rows = "".join(
            f'<tr><td>{esc(r.get("date", ""))}</td><td><a href="/wiki/{esc(r["page"])}">{esc(titles.get(r["page"], r["page"]))}</a></td>'
            f"<td>{esc(r.get('author', ''))}</td><td>{esc(r.get('summary', ''))}</td></tr>"
            for r in latest
        )
        return self.page(
            "Recent changes", f"<table><tr><th>Date</th><th>Page</th><th>By</th><th>Summary</th></tr>{rows}</table>"
        )

    @route("GET", "/search")
    def search_page(self, request) -> Response:
        query = request.value("q")
        words = query.lower().split()
        found = [
            p for p in self.records["pages"] if words and all(w in f"{p['title']} {p['body']}".lower() for w in words)
        ]
        found.sort(key=lambda p: (not all(w in str(p["title"]).lower() for w in words), str(p["title"]).lower()))
        items = ""
        for page in found:
            text = " ".join(str(page["body"]).split())
            at = max(0, text.lower().find(words[0]) - 60)
            snippet = ("..." if at else "") + text[at : at + 160] + ("..." if at + 160 < len(text) else "")
            items += f'<li><a href="/wiki/{esc(page["id"])}">{esc(page["title"])}</a><div class="hint">{esc(snippet)}</div></li>'
        if not words:
            said = "Type what you are looking for in the search box."
        else:
            said = f"{len(found)} page{'s' if len(found) != 1 else ''} match &ldquo;{esc(query)}&rdquo;."
            if self.find("pages", slug(query)) is None and slug(query):
                said += f' <a href="/new?title={esc(query)}">Create the page &ldquo;{esc(query)}&rdquo;</a>'
        return self.page("Search results", f"<p>{said}</p><ul>{items}</ul>", query=query)

    @route("GET", "/wiki/{pid}")
    def view(self, request, pid: str) -> Response:
        page = self._page(pid)
        actions = (
            f'<p><a href="/wiki/{esc(pid)}/edit" id="edit">Edit this page</a> &middot; '
            f'<a href="/wiki/{esc(pid)}/history" id="history">History</a></p>'
        )
        footer = f'<p class="hint">Last edited on {esc(page.get("updated", ""))} by {esc(page.get("author", ""))}.</p>'
        return self.page(
            str(page["title"]), f'{actions}<div id="content">{self._render(str(page["body"]))}</div>{footer}'
        )

    @route("GET", "/wiki/{pid}/history")
    def history(self, request, pid: str) -> Response:
        page = self._page(pid)
        revisions = self._revisions(pid)
        current = revisions[-1]["number"] if revisions else 0
        rows = "".join(
            f'<tr><td><a href="/wiki/{esc(pid)}/revision/{r["number"]}" id="revision-{r["number"]}">Revision {r["number"]}</a>'
            f"{' (current)' if r['number'] == current else ''}</td><td>{esc(r.get('date', ''))}</td>"
            f"<td>{esc(r.get('author', ''))}</td><td>{esc(r.get('summary', ''))}</td></tr>"
            for r in reversed(revisions)
        )
        table = f"<table><tr><th>Revision</th><th>Date</th><th>By</th><th>Summary</th></tr>{rows}</table>"
        return self.page(
            f"History of {page['title']}", f'<p><a href="/wiki/{esc(pid)}">Back to the page</a></p>{table}'
        )

    @route("GET", "/wiki/{pid}/revision/{number}")
    def revision(self, request, pid: str, number: str) -> Response:
        page = self._page(pid)
        revisions = self._revisions(pid)
        found = next((r for r in revisions if str(r["number"]) == number), None)
        if found is None:
            raise Refused(404, f"{page['title']} has no revision {number}.")
        restore = ""
        if found is not revisions[-1]:
            restore = form(
                f"/wiki/{pid}/restore",
                hidden("revision", found["number"])
                + text_field("Summary", "summary", f"Restore revision {found['number']}", size=40),
                button="Restore this version",
                button_id="restore",
            )
        about = (
            f'<p class="notice">Revision {found["number"]} of {esc(page["title"])}, saved on {esc(found.get("date", ""))}'
            f" by {esc(found.get('author', ''))}: {esc(found.get('summary', ''))}"
            f"{' (the current version)' if found is revisions[-1] else ''}.</p>"
        )
        links = f'<p><a href="/wiki/{esc(pid)}/history">Back to the history</a></p>'
        return self.page(
            f"{page['title']} (revision {found['number']})",
            f'{about}{links}<div id="content">{self._render(str(found["body"]))}</div>{restore}',
        )

    # Writing.

    def _check(self, body: str, summary: str, errors: dict) -> None:
        if not body.strip():
            errors["body"] = "A page cannot be empty."
        elif len(body) > MAX_BODY:
            errors["body"] = f"A page holds at most {MAX_BODY} characters."
        if not summary:
            errors["summary"] = 'Describe your change in the summary, for example "Fix a typo".'
        elif len(summary) > MAX_SUMMARY:
            errors["summary"] = f"A summary holds at most {MAX_SUMMARY} characters."

    def _save(self, page: dict, body: str, summary: str) -> None:
        self.room("revisions")
        revisions = self._revisions(page["id"])
        number = int(revisions[-1]["number"]) + 1 if revisions else 1
        body = body.replace("\r\n", "\n")
        page.update(body=body, updated=self.today, author=self.user)
        self.records["revisions"].append(
            {
                "id": f"rev-{page['id']}-{number}",
                "page": page["id"],
                "number": number,
                "body": body,
                "summary": summary,
                "author": self.user,
                "date": self.today,
            }
        )

    def _edit_page(self, page: dict, body: str, summary: str, errors: dict, status: int = 200) -> Response:
        fields = textarea("Page text", "body", body, errors=errors, rows=16) + text_field(
            "Summary", "summary", summary, errors=errors, hint="(what you changed and why)", size=60
        )
        help_text = '<p class="hint">A blank line starts a paragraph; "- " starts a list item; [[Page title]] links to a page.</p>'
        save = form(f"/wiki/{page['id']}/edit", fields, button="Save page", button_id="save")
        content = f'{errors_box(errors)}{help_text}{save}<p><a href="/wiki/{esc(page["id"])}">Cancel</a></p>'

        return self.page(f"Editing {page['title']}", content, status=status)

    @route("GET", "/wiki/{pid}/edit")
    def edit(self, request, pid: str) -> Response:
        page = self._page(pid)
        return self._edit_page(page, str(page["body"]), "", {})

    @route("POST", "/wiki/{pid}/edit")
    def save(self, request, pid: str) -> Response:
        page = self._page(pid)
        body, summary = request.form.get("body", ""), request.value("summary")
        body = (body[0] if isinstance(body, list) and body else body if isinstance(body, str) else "").rstrip()
        errors: dict = {}
        self._check(body, summary, errors)
        if not errors and body.replace("\r\n", "\n") == str(page["body"]).rstrip():
            errors["body"] = "You have not changed the text: there is nothing to save."
        if errors:
            return self._edit_page(page, body, summary, errors, 422)
        self._save(page, body, summary)
        return Response.redirect(f"/wiki/{pid}")

    @route("POST", "/wiki/{pid}/restore")
    def restore(self, request, pid: str) -> Response:
        page = self._page(pid)
        revisions = self._revisions(pid)
        found = next((r for r in revisions if str(r["number"]) == request.value("revision")), None)
        if found is None:
            raise Refused(404, f"{page['title']} has no revision {request.value('revision')!r}.")
        if found is revisions[-1]:
            raise Refused(422, f"Revision {found['number']} is the current version already.")
        summary = request.value("summary") or f"Restore revision {found['number']}"
        self._save(page, str(found["body"]), summary[:MAX_SUMMARY])
        return Response.redirect(f"/wiki/{pid}")

    def _new_page(self, title: str, body: str, summary: str, errors: dict, status: int = 200) -> Response:
        fields = (
            text_field("Title", "title", title, errors=errors, size=40)
            + textarea("Page text", "body", body, errors=errors, rows=12)
            + text_field("Summary", "summary", summary, errors=errors, size=60)
        )
        return self.page(
            "Create a page",
            errors_box(errors) + form("/new", fields, button="Create page", button_id="create"),
            status=status,
        )

    @route("GET", "/new")
    def new(self, request) -> Response:
        return self._new_page(request.value("title"), "", "Created page", {})

    @route("POST", "/new")
    def create(self, request) -> Response:
        title, summary = request.value("title"), request.value("summary")
        body = request.form.get("body", "")
        body = (body[0] if isinstance(body, list) and body else body if isinstance(body, str) else "").rstrip()
        errors: dict = {}
        if not title:
            errors["title"] = "Give the page a title."
        elif len(title) > MAX_TITLE:
            errors["title"] = f"A title holds at most {MAX_TITLE} characters."
        elif not slug(title):
            errors["title"] = "Use letters or digits in the title."
        elif self.find("pages", slug(title)) is not None:
            errors["title"] = (
                f"A page called {self.find('pages', slug(title))['title']} exists already: edit it instead."  # type: ignore[index]
            )
        self._check(body, summary, errors)
        if errors:
            return self._new_page(title, body, summary, errors, 422)
        self.room("pages")
        page = {"id": slug(title), "title": title, "body": "", "updated": self.today, "author": self.user}
        self.records["pages"].append(page)
        self._save(page, body, summary)
        return Response.redirect(f"/wiki/{page['id']}")
