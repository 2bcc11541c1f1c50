// Virtualised rows: only the rows in view (and a few around) are in the DOM, however many
// items there are. Rows are kept by key and updated in place, so focus inside a row survives
// re-renders.

const OVERSCAN = 6;

export class VirtualTable {
  /**
   * scroller: the scrolling element; tbody: the table body inside it; columns: cell count;
   * key(item), create(item) -> <tr>, update(tr, item, index) fill a row.
   */
  constructor({scroller, tbody, columns, key, create, update, estimate = 34}) {
    Object.assign(this, {scroller, tbody, key, create, update});
    this.rowHeight = estimate;
    this.measured = false;
    this.items = [];
    this.rows = new Map();
    this.top = spacer(columns);
    this.bottom = spacer(columns);
    tbody.replaceChildren(this.top, this.bottom);
    scroller.addEventListener("scroll", () => this.render(), {passive: true});
  }

  setItems(items) { this.items = items; }

  /** The index range in view. */
  window() {
    const head = this.tbody.parentElement.tHead?.offsetHeight || 0;
    const top = Math.max(0, this.scroller.scrollTop - head);
    const height = this.scroller.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / this.rowHeight) - OVERSCAN);
    const last = Math.min(this.items.length, Math.ceil((top + height) / this.rowHeight) + OVERSCAN);
    return [first, last];
  }

  render() {
    const [first, last] = this.window();
    const focused = this.tbody.contains(document.activeElement) ? document.activeElement : null;
    const wanted = new Map();
    let before = this.top;
    for (let i = first; i < last; i++) {
      const item = this.items[i];
      const k = this.key(item);
      let row = this.rows.get(k);
      if (!row) row = this.create(item);
      wanted.set(k, row);
      this.update(row, item, i);
      if (before.nextSibling !== row) before.after(row);
      before = row;
    }
    for (const [k, row] of this.rows) if (!wanted.has(k)) row.remove();
    this.rows = wanted;
    this.top.firstChild.style.height = `${first * this.rowHeight}px`;
    this.bottom.firstChild.style.height = `${(this.items.length - last) * this.rowHeight}px`;
    if (!this.measured && wanted.size) {
      const height = wanted.values().next().value.getBoundingClientRect().height;
      if (height > 0) {
        this.measured = true;
        if (Math.abs(height - this.rowHeight) > 0.5) {
          this.rowHeight = height;
          this.render();
          return;
        }
      }
    }
    if (focused && focused.isConnected && document.activeElement !== focused) focused.focus({preventScroll: true});
  }
}

function spacer(columns) {
  const tr = document.createElement("tr");
  tr.className = "spacer";
  tr.setAttribute("aria-hidden", "true");
  const td = document.createElement("td");
  td.colSpan = columns;
  tr.append(td);
  return tr;
}
