"""A web shop: a catalogue in categories, search, product pages with options, a cart, a checkout.

Data (a task's `data`; every list optional but `products`):

    {"title": "Hearth & Trail", "today": "2026-03-02",
     "categories": [{"id": "jackets", "name": "Jackets"}],
     "products": [{"id": "p-101", "name": "Ridge Rain Jacket", "category": "jackets", "price": 89.0,
                   "description": "...", "options": {"size": ["S", "M"], "colour": ["Moss"]}, "stock": 12}],
     "shipping": [{"id": "standard", "name": "Standard delivery (3-5 working days)", "price": 4.95}],
     "coupons": [{"code": "TRAIL10", "percent": 10, "expires": "2026-04-30"}],
     "cart": [], "orders": [], "order_lines": []}

State: `products` (their `stock` goes down as orders are placed), `cart` (lines: `product`, `name`,
`options` `{"size": "M"}`, `quantity`, `price`), `orders` (`name`, `email`, `address`, `city`,
`postcode`, `shipping`, `coupon`, `subtotal`, `discount`, `shipping_cost`, `total`, `items`,
`status`) and `order_lines` (a cart line as ordered, with its `order`).
"""

from __future__ import annotations

import re

from orchard.recipes.gui.site import (
    Refused,
    Response,
    Site,
    errors_box,
    esc,
    form,
    hidden,
    money,
    radios,
    route,
    row,
    select,
    text_field,
)

EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
POSTCODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 -]{1,9}")
MAX_QUANTITY = 99


def _cents(amount: object) -> int:
    return round(float(amount) * 100)  # type: ignore[arg-type]


def _dollars(cents: int) -> float:
    return round(cents / 100, 2)


class Shop(Site):
    name = "shop"
    title = "Hearth & Trail"
    collections = ("products", "cart", "orders", "order_lines")
    search = "/search"
    search_hint = "Search products"

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        for product in self.records["products"]:
            if not isinstance(product.get("id"), str) or not product.get("name"):
                raise ValueError("shop's data: every product needs a string `id` and a `name`")
            product.setdefault("options", {})
            product.setdefault("stock", 10)
            product.setdefault("description", "")
        self.categories = {str(c["id"]): str(c["name"]) for c in self.data.get("categories", [])}
        self.shipping = {
            str(s["id"]): s
            for s in self.data.get("shipping") or [{"id": "standard", "name": "Standard delivery", "price": 4.95}]
        }
        self.coupons = {str(c["code"]).upper(): c for c in self.data.get("coupons", [])}
        self.today = str(self.data.get("today", "2026-03-02"))

    def nav(self) -> list:
        units = sum(int(line["quantity"]) for line in self.records["cart"])
        return [("/orders", "Your orders"), ("/cart", f"Cart ({units})")]

    # Browsing.

    def _cards(self, products: list) -> str:
        if not products:
            return "<p>No products found.</p>"
        cards = "".join(
            f'<div class="card"><a href="/product/{esc(p["id"])}"><strong>{esc(p["name"])}</strong></a>'
            f'<div class="price">{money(float(p["price"]))}</div>'
            f'<div class="hint">{esc(self.categories.get(str(p.get("category")), ""))}</div></div>'
            for p in products
        )
        return f'<div class="grid">{cards}</div>'

    def _category_links(self) -> str:
        links = "".join(
            f'<li><a href="/category/{esc(cid)}">{esc(name)}</a></li>' for cid, name in self.categories.items()
        )
        return f"<h2>Shop by category</h2><ul>{links}</ul>" if links else ""

    @route("GET", "/")
    def home(self, request) -> Response:
        return self.page(
            "Welcome", f"{self._category_links()}<h2>All products</h2>{self._cards(self.records['products'])}"
        )

    @route("GET", "/category/{cid}")
    def category(self, request, cid: str) -> Response:
        if cid not in self.categories:
            raise Refused(404, f"There is no category {cid!r}.")
        found = [p for p in self.records["products"] if p.get("category") == cid]
        return self.page(self.categories[cid], self._cards(found) + '<p><a href="/">All categories</a></p>')

    @route("GET", "/search")
    def search_page(self, request) -> Response:
        query = request.value("q")
        words = query.lower().split()
        found = [
            p
            for p in self.records["products"]
            if words
            and all(
                w in f"{p['name']} {p['description']} {self.categories.get(str(p.get('category')), '')}".lower()
                for w in words
            )
        ]
        said = (
            f"{len(found)} result{'s' if len(found) != 1 else ''} for &ldquo;{esc(query)}&rdquo;"
            if words
            else "Type what you are looking for in the search box."
        )
        return self.page("Search", f"<p>{said}</p>{self._cards(found) if words else ''}", query=query)

    def _product_page(self, product: dict, errors: dict, chosen: dict, status: int = 200) -> Response:
        stock = int(product["stock"])
        stock_text = "Out of stock" if stock <= 0 else f"Only {stock} left in stock" if stock <= 5 else "In stock"
        fields = "".join(
            select(
                option.capitalize(), option, values, chosen.get(option, ""), errors=errors, prompt=f"Choose a {option}"
            )
            for option, values in product["options"].items()
        )
        fields += text_field("Quantity", "quantity", chosen.get("quantity", "1"), errors=errors, kind="number")
        buy = form(
            "/cart/add", hidden("product", product["id"]) + fields, button="Add to cart", button_id="add-to-cart"
        )
        category = self.categories.get(str(product.get("category")), "")
        back = (
            f'<a href="/category/{esc(product.get("category"))}">{esc(category)}</a>'
            if category
            else '<a href="/">Home</a>'
        )
        content = (
            f"{errors_box(errors)}<p>{back}</p>"
            f'<p class="price" id="price">{money(float(product["price"]))}</p><p>{esc(product["description"])}</p>'
            f'<p id="stock">{stock_text}</p>{buy}'
        )
        return self.page(str(product["name"]), content, status=status)

    @route("GET", "/product/{pid}")
    def product(self, request, pid: str) -> Response:
        found = self.find("products", pid)
        if found is None:
            raise Refused(404, f"There is no product {pid!r}.")
        return self._product_page(found, {}, {})

    # The cart.

    def _quantity(self, text: str, errors: dict) -> int:
        if not text.isdigit() or not 1 <= int(text) <= MAX_QUANTITY:
            errors["quantity"] = f"Enter a quantity from 1 to {MAX_QUANTITY}."
            return 0
        return int(text)

    @route("POST", "/cart/add")
    def add(self, request) -> Response:
        product = self.find("products", request.value("product"))
        if product is None:
            raise Refused(404, "There is no such product.")
        errors: dict = {}
        chosen = {option: request.value(option) for option in product["options"]}
        for option, values in product["options"].items():
            if chosen[option] not in [str(v) for v in values]:
                errors[option] = f"Choose a {option}."
        quantity = self._quantity(request.value("quantity", "1"), errors)
        line = next(
            (line for line in self.records["cart"] if line["product"] == product["id"] and line["options"] == chosen),
            None,
        )
        wanted = quantity + (int(line["quantity"]) if line else 0)
        if quantity and wanted > int(product["stock"]):
            errors["quantity"] = f"Only {product['stock']} left in stock" + (
                f" and your cart holds {line['quantity']} already." if line else "."
            )
        if errors:
            return self._product_page(product, errors, {**chosen, "quantity": request.value("quantity", "1")}, 422)
        if line:
            line["quantity"] = wanted
        else:
            self.room("cart")
            self.records["cart"].append(
                {
                    "id": self.new_id("line"),
                    "product": product["id"],
                    "name": product["name"],
                    "options": chosen,
                    "quantity": quantity,
                    "price": float(product["price"]),
                }
            )
        return Response.redirect("/cart")

    def _cart_page(self, errors: dict, status: int = 200, notice: str = "") -> Response:
        cart = self.records["cart"]
        if not cart:
            return self.page(
                "Your cart", '<p>Your cart is empty.</p><p><a href="/">Continue shopping</a></p>', status=status
            )
        rows = ""
        for line in cart:
            options = ", ".join(f"{k.capitalize()}: {v}" for k, v in line["options"].items())
            update = form(
                "/cart/update",
                hidden("line", line["id"])
                + f'<input type="number" name="quantity" id="quantity-{esc(line["id"])}" value="{esc(line["quantity"])}"'
                f' size="3" aria-label="Quantity of {esc(line["name"])}">',
                button="Update",
                button_id=f"update-{line['id']}",
                css="inline",
            )
            rows += (
                f'<tr><td><a href="/product/{esc(line["product"])}">{esc(line["name"])}</a>'
                f'<div class="hint">{esc(options)}</div></td><td>{money(float(line["price"]))}</td><td>{update}</td>'
                f"<td>{money(_dollars(_cents(line['price']) * int(line['quantity'])))}</td>"
                f'<td><a href="/cart/remove?line={esc(line["id"])}" id="remove-{esc(line["id"])}">Remove</a></td></tr>'
            )
        subtotal = sum(_cents(line["price"]) * int(line["quantity"]) for line in cart)
        content = (
            f"{errors_box(errors)}{notice}<table><tr><th>Product</th><th>Price</th><th>Quantity</th><th>Total</th><th></th></tr>"
            f'{rows}</table><p>Subtotal: <span class="price" id="subtotal">{money(_dollars(subtotal))}</span></p>'
            '<p><a href="/checkout" id="checkout">Go to checkout</a> &middot; <a href="/">Continue shopping</a></p>'
        )
        return self.page("Your cart", content, status=status)

    @route("GET", "/cart")
    def cart(self, request) -> Response:
        return self._cart_page({})

    @route("POST", "/cart/update")
    def update(self, request) -> Response:
        line = self.find("cart", request.value("line"))
        if line is None:
            raise Refused(404, "That line is not in your cart any more.")
        text = request.value("quantity")
        if text == "0":
            self.records["cart"].remove(line)
            return Response.redirect("/cart")
        errors: dict = {}
        quantity = self._quantity(text, errors)
        product = self.find("products", line["product"]) or {"stock": 0}
        if quantity > int(product["stock"]):
            errors["quantity"] = f"Only {product['stock']} of {line['name']} left in stock."
        if errors:
            return self._cart_page(errors, 422)
        line["quantity"] = quantity
        return Response.redirect("/cart")

    @route("GET", "/cart/remove", changes=True)
    def remove(self, request) -> Response:
        line = self.find("cart", request.value("line"))
        if line is None:
            raise Refused(404, "That line is not in your cart any more.")
        self.records["cart"].remove(line)
        return Response.redirect("/cart")

    # Checkout and orders.

    FIELDS = ("name", "email", "address", "city", "postcode", "shipping", "coupon")

    def _checkout_page(self, values: dict, errors: dict, status: int = 200) -> Response:
        cart = self.records["cart"]
        if not cart:
            return self.page(
                "Checkout", '<p>Your cart is empty.</p><p><a href="/">Continue shopping</a></p>', status=status
            )
        summary = "".join(
            f"<li>{esc(line['quantity'])} &times; {esc(line['name'])}"
            f"{' (' + esc(', '.join(str(v) for v in line['options'].values())) + ')' if line['options'] else ''}"
            f" &ndash; {money(_dollars(_cents(line['price']) * int(line['quantity'])))}</li>"
            for line in cart
        )
        choices = [(sid, f"{s['name']} ({money(float(s['price']))})") for sid, s in self.shipping.items()]
        subtotal = sum(_cents(line["price"]) * int(line["quantity"]) for line in cart)
        fields = (
            row(
                text_field("Full name", "name", values.get("name", ""), errors=errors),
                text_field("Email", "email", values.get("email", ""), errors=errors, kind="email"),
            )
            + text_field("Street address", "address", values.get("address", ""), errors=errors, size=40)
            + row(
                text_field("Town or city", "city", values.get("city", ""), errors=errors),
                text_field("Postcode", "postcode", values.get("postcode", ""), errors=errors, size=10),
            )
            + radios("Delivery", "shipping", choices, values.get("shipping", ""), errors=errors)
            + text_field("Discount code", "coupon", values.get("coupon", ""), errors=errors, hint="(optional)", size=14)
        )
        order = f'<div class="card"><strong>Your order</strong><ul>{summary}</ul>{money(_dollars(subtotal))} before delivery</div>'
        content = (
            f'{errors_box(errors)}<div class="columns">'
            f"{form('/checkout', fields, button='Place order', button_id='place-order')}{order}</div>"
        )
        return self.page("Checkout", content, status=status)

    @route("GET", "/checkout")
    def checkout(self, request) -> Response:
        return self._checkout_page({}, {})

    @route("POST", "/checkout")
    def place(self, request) -> Response:
        values = {name: request.value(name) for name in self.FIELDS}
        errors: dict = {}
        if not self.records["cart"]:
            raise Refused(422, "Your cart is empty: there is nothing to order.")
        if not values["name"]:
            errors["name"] = "Enter your full name."
        if not EMAIL.fullmatch(values["email"]):
            errors["email"] = "Enter an email address like name@example.com."
        if not values["address"]:
            errors["address"] = "Enter the street address."
        if not values["city"]:
            errors["city"] = "Enter the town or city."
        if not POSTCODE.fullmatch(values["postcode"]):
            errors["postcode"] = "Enter a postcode."
        if values["shipping"] not in self.shipping:
            errors["shipping"] = "Choose a delivery option."
        coupon = self.coupons.get(values["coupon"].upper()) if values["coupon"] else None
        if values["coupon"] and coupon is None:
            errors["coupon"] = f"{values['coupon']} is not a valid discount code."
        elif coupon and str(coupon.get("expires", "9999-12-31")) < self.today:
            errors["coupon"] = f"The code {coupon['code']} expired on {coupon['expires']}."
        for line in self.records["cart"]:
            product = self.find("products", line["product"]) or {"stock": 0}
            if int(line["quantity"]) > int(product["stock"]):
                errors[f"stock-{line['id']}"] = f"Only {product['stock']} of {line['name']} left in stock."
        if errors:
            return self._checkout_page(values, errors, 422)
        self.room("orders")
        subtotal = sum(_cents(line["price"]) * int(line["quantity"]) for line in self.records["cart"])
        discount = round(subtotal * float(coupon["percent"]) / 100) if coupon else 0
        delivery = _cents(self.shipping[values["shipping"]]["price"])
        self.counter += 1
        order_id = f"HT-{4000 + self.counter}"
        order = {
            "id": order_id,
            "date": self.today,
            "status": "placed",
            **{name: values[name] for name in ("name", "email", "address", "city", "postcode", "shipping")},
            "coupon": coupon["code"] if coupon else "",
            "subtotal": _dollars(subtotal),
            "discount": _dollars(discount),
            "shipping_cost": _dollars(delivery),
            "total": _dollars(subtotal - discount + delivery),
            "items": sum(int(line["quantity"]) for line in self.records["cart"]),
        }
        self.records["orders"].append(order)
        for line in self.records["cart"]:
            self.records["order_lines"].append({**line, "id": f"{order_id}-{line['id']}", "order": order_id})
            product = self.find("products", line["product"])
            if product is not None:
                product["stock"] = int(product["stock"]) - int(line["quantity"])
        self.records["cart"] = []
        return Response.redirect(f"/order/{order_id}")

    @route("GET", "/order/{oid}")
    def order(self, request, oid: str) -> Response:
        order = self.find("orders", oid)
        if order is None:
            raise Refused(404, f"There is no order {oid!r}.")
        lines = "".join(
            f"<tr><td>{esc(line['name'])}</td><td>{esc(', '.join(str(v) for v in line.get('options', {}).values()))}</td>"
            f"<td>{esc(line['quantity'])}</td><td>{money(float(line['price']))}</td></tr>"
            for line in self.records["order_lines"]
            if line.get("order") == oid
        )
        shipping = self.shipping.get(str(order.get("shipping")), {"name": order.get("shipping", "")})
        notice = (
            f'<p class="notice">Thank you! Your order {esc(oid)} is placed.</p>'
            if order.get("status") == "placed"
            else ""
        )
        content = (
            f'{notice}<p>Status: <strong id="status">{esc(order.get("status", ""))}</strong> &middot; Ordered on {esc(order.get("date", ""))}</p>'
            f"<table><tr><th>Product</th><th>Options</th><th>Quantity</th><th>Price</th></tr>{lines}</table>"
            f"<p>Delivery: {esc(shipping['name'])} to {esc(order.get('name', ''))}, {esc(order.get('address', ''))},"
            f" {esc(order.get('city', ''))} {esc(order.get('postcode', ''))}</p>"
            f"<p>Subtotal {money(float(order.get('subtotal', 0)))}"
            f"{' &middot; Discount (' + esc(order['coupon']) + ') &minus;' + money(float(order.get('discount', 0))) if order.get('coupon') else ''}"
            f" &middot; Delivery {money(float(order.get('shipping_cost', 0)))}"
            f' &middot; Total <span class="price" id="total">{money(float(order.get("total", 0)))}</span></p>'
            '<p><a href="/orders">All your orders</a></p>'
        )
        return self.page(f"Order {oid}", content)

    @route("GET", "/orders")
    def orders(self, request) -> Response:
        rows = "".join(
            f'<tr><td><a href="/order/{esc(o["id"])}">{esc(o["id"])}</a></td><td>{esc(o.get("date", ""))}</td>'
            f"<td>{esc(o.get('items', ''))}</td><td>{money(float(o.get('total', 0)))}</td><td>{esc(o.get('status', ''))}</td></tr>"
            for o in reversed(self.records["orders"])
        )
        table = (
            f"<table><tr><th>Order</th><th>Date</th><th>Items</th><th>Total</th><th>Status</th></tr>{rows}</table>"
            if rows
            else "<p>You have not ordered anything yet.</p>"
        )
        return self.page("Your orders", table)
