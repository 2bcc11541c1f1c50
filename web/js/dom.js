// Small DOM helpers: build elements, and write text only when it changed (cheap re-renders).

/** An element with attributes (`on*` functions become listeners) and children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "text") {
      el.textContent = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Set an element's text if it differs (no layout work when nothing changed). */
export function setText(el, text) {
  const value = String(text);
  if (el.textContent !== value) el.textContent = value;
}

/** Set an attribute if it differs; `null` removes it. */
export function setAttr(el, name, value) {
  if (value === null || value === undefined) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else if (el.getAttribute(name) !== String(value)) {
    el.setAttribute(name, String(value));
  }
}

/** A badge for a trading state: colour, glyph and word (never colour alone). */
export function stateBadge(state) {
  return h("span", {class: `state ${state}`, text: state});
}

/** Update a badge made by `stateBadge`. */
export function setState(el, state) {
  setText(el, state);
  const cls = `state ${state}`;
  if (el.className !== cls) el.className = cls;
}

/** Replace an element's children (arrays are flattened; null, undefined and false skipped). */
export function replace(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
}

/**
 * Rebuild part of the page without losing the keyboard focus: the element focused inside
 * `container` before is found again afterwards by its `data-focus-key`.
 */
export function keepingFocus(container, rebuild) {
  const focused = container.contains(document.activeElement) ? document.activeElement : null;
  const key = focused?.dataset.focusKey;
  rebuild();
  if (key && !focused.isConnected) {
    container.querySelector(`[data-focus-key="${CSS.escape(key)}"]`)?.focus({preventScroll: true});
  }
}
