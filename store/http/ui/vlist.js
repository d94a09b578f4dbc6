// A windowed list: rows of one fixed height, of which only those in view (and a few around
// them) exist in the document, whatever the count. A 10,000-entry session is a spacer of the
// whole height and about forty row elements.

export class WindowedList {
  // render(element, index): fill a row element for row `index` (called again on refresh).
  constructor(container, { rowHeight, render, overscan = 12 }) {
    this.el = container
    this.rowHeight = rowHeight
    this.renderRow = render
    this.overscan = overscan
    this.count = 0
    this.rows = new Map() // index -> element
    this.frame = 0
    this.el.classList.add("vlist")
    this.spacer = document.createElement("div")
    this.spacer.className = "vlist-spacer"
    this.el.append(this.spacer)
    this.el.addEventListener("scroll", () => this.schedule(), { passive: true })
    this.resize = new ResizeObserver(() => this.schedule())
    this.resize.observe(this.el)
  }

  destroy() {
    this.resize.disconnect()
    if (this.frame) cancelAnimationFrame(this.frame)
  }

  // A new row count; every row in view is drawn again (`now`: before returning).
  setCount(count, { now = false } = {}) {
    this.count = count
    this.spacer.style.height = `${count * this.rowHeight}px`
    this.refresh({ now })
  }

  refresh({ now = false } = {}) {
    this.stale = true
    if (now) this.draw()
    else this.schedule()
  }

  schedule() {
    if (this.frame) return
    this.frame = requestAnimationFrame(() => {
      this.frame = 0
      this.draw()
    })
  }

  draw() {
    const height = this.el.clientHeight || window.innerHeight
    const top = this.el.scrollTop
    const first = Math.max(0, Math.floor(top / this.rowHeight) - this.overscan)
    const last = Math.min(this.count, Math.ceil((top + height) / this.rowHeight) + this.overscan)
    const spare = []
    for (const [index, row] of this.rows) {
      if (index < first || index >= last) {
        this.rows.delete(index)
        spare.push(row)
      } else if (this.stale) {
        this.renderRow(row, index)
      }
    }
    for (let index = first; index < last; index++) {
      if (this.rows.has(index)) continue
      let row = spare.pop()
      if (!row) {
        row = document.createElement("div")
        row.className = "vrow"
        row.style.height = `${this.rowHeight}px`
        this.el.append(row)
      }
      row.style.top = `${index * this.rowHeight}px`
      row.dataset.index = String(index)
      this.renderRow(row, index)
      this.rows.set(index, row)
    }
    for (const row of spare) row.remove()
    this.stale = false
  }

  // Scrolls so that row `index` is in view (centred when it was out of view).
  scrollTo(index) {
    const top = index * this.rowHeight
    const view = this.el.clientHeight
    if (top < this.el.scrollTop || top + this.rowHeight > this.el.scrollTop + view) {
      this.el.scrollTop = Math.max(0, top - view / 2)
    }
    this.schedule()
  }
}
