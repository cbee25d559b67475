import pytest

from textkit import Template, TemplateSyntaxError, UndefinedError, render


class User:
    def __init__(self, name, admin=False):
        self.name = name
        self.admin = admin


def test_variables_and_dotted_lookup():
    data = {"user": User("ann"), "team": {"name": "Core"}, "tags": ["x", "y"]}
    out = render("{{ user.name }} of {{ team.name }} ({{ tags.1 }})", data)
    assert out == "ann of Core (y)"


def test_missing_variables():
    assert render("[{{ nope }}][{{ user.nope }}]", user=User("a")) == "[][]"
    with pytest.raises(UndefinedError):
        Template("{{ nope }}", strict=True).render()


def test_filters():
    out = render("{{ name|upper }} {{ title|slug }} {{ items|length }} {{ items|join }}",
                 name="ann", title="Hello World", items=["a", "b"])
    assert out == "ANN hello-world 2 a, b"


def test_escape_filter():
    assert render("{{ html|escape }}", html='<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"


def test_unknown_filter_is_a_syntax_error():
    with pytest.raises(TemplateSyntaxError, match="unknown filter"):
        Template("{{ x|frobnicate }}")


def test_for_loop_with_loop_info():
    out = render("{% for n in nums %}{{ loop.index }}:{{ n }}{% if not loop.last %}, {% endif %}{% endfor %}",
                 nums=[10, 20, 30])
    assert out == "1:10, 2:20, 3:30"


def test_if_else_inside_for():
    users = [User("ann", admin=True), User("bob")]
    source = "{% for u in users %}{% if u.admin %}*{% else %}-{% endif %}{{ u.name }} {% endfor %}"
    assert render(source, users=users) == "*ann -bob "


def test_for_inside_if_else():
    source = "{% if items %}{% for i in items %}<{{ i }}>{% endfor %}{% else %}none{% endif %}"
    assert render(source, items=["a", "b"]) == "<a><b>"
    assert render(source, items=[]) == "none"


def test_comments_are_dropped():
    assert render("a{# hidden {{ x }} #}b") == "ab"


def test_syntax_errors_report_line():
    with pytest.raises(TemplateSyntaxError, match="line 2"):
        Template("ok\n{% for x in %}")
    with pytest.raises(TemplateSyntaxError, match="never closed"):
        Template("{% if x %}open")
    with pytest.raises(TemplateSyntaxError, match="unexpected"):
        Template("{% endif %}")


def test_template_is_reusable():
    template = Template("Hi {{ name }}")
    assert template.render(name="a") == "Hi a"
    assert template.render({"name": "b"}) == "Hi b"
