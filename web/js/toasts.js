// Notifications: at most MAX_SHOWN at once (the oldest settled one goes first), the same
// words again collapse into one with a count, each can be closed (× button, keyboard too)
// and each expires by itself unless it is still pending or has the focus.

import {h} from "./dom.js";

const MAX_SHOWN = 3;
const LIFETIME_MS = {ok: 6_000, info: 8_000, bad: 12_000, pending: null};

export class Toasts {
  constructor(container) {
    this.container = container;
    this.shown = [];   // oldest first
  }

  /**
   * Show `text` (`kind`: ok | info | bad | pending); returns a handle whose `update(text,
   * kind)` rewrites it in place (a pending control's answer) and `close()` removes it.
   */
  show(text, kind = "ok") {
    const same = this.shown.find((t) => t.text === text && t.kind === kind && kind !== "pending");
    if (same) {
      same.count += 1;
      same.counter.textContent = `×${same.count}`;
      same.counter.hidden = false;
      this._expire(same);
      return same.handle;
    }
    const words = h("span", {class: "toast-text"}, text);
    const counter = h("span", {class: "toast-count", hidden: true, "aria-label": "times"});
    const close = h("button", {type: "button", class: "toast-close", "aria-label": "Dismiss notification",
      title: "Dismiss"}, "×");
    const el = h("div", {class: `toast ${kind}`, "data-kind": kind}, words, counter, close);
    const toast = {el, words, counter, text, kind, count: 1, timer: null};
    toast.handle = {
      update: (next, nextKind = "ok") => this._update(toast, next, nextKind),
      close: () => this._remove(toast),
      get element() { return el; },
    };
    close.addEventListener("click", () => this._remove(toast, true));
    el.addEventListener("focusout", () => this._expire(toast));
    this.shown.push(toast);
    this.container.append(el);
    this._trim();
    this._expire(toast);
    return toast.handle;
  }

  _update(toast, text, kind) {
    const same = this.shown.find((t) => t !== toast && t.text === text && t.kind === kind && kind !== "pending");
    if (!toast.el.isConnected || same) {
      // Closed meanwhile (the answer still deserves a word), or words already shown: one.
      if (toast.el.isConnected) this._remove(toast);
      this.show(text, kind);
      return;
    }
    Object.assign(toast, {text, kind});
    toast.words.textContent = text;
    toast.el.className = `toast ${kind}`;
    toast.el.dataset.kind = kind;
    this._expire(toast);
  }

  _expire(toast) {
    clearTimeout(toast.timer);
    const life = LIFETIME_MS[toast.kind];
    if (!life) return;
    toast.timer = setTimeout(() => {
      if (toast.el.contains(document.activeElement)) return;  // read on focusout
      this._remove(toast);
    }, life);
  }

  /** Keep at most MAX_SHOWN: the oldest settled ones go (a pending one only if all are). */
  _trim() {
    while (this.shown.length > MAX_SHOWN) {
      const victim = this.shown.find((t) => t.kind !== "pending") || this.shown[0];
      this._remove(victim);
    }
  }

  _remove(toast, byHand = false) {
    clearTimeout(toast.timer);
    const index = this.shown.indexOf(toast);
    if (index >= 0) this.shown.splice(index, 1);
    const next = byHand && toast.el.contains(document.activeElement)
      ? (this.shown[index] || this.shown[index - 1])?.el.querySelector(".toast-close") : null;
    toast.el.remove();
    if (byHand) (next || document.getElementById("main")).focus({preventScroll: true});
  }
}
