//! The one guest-memory helper: bounds-checked reads and writes of the guest's linear
//! memory, and allocation of returned buffers through the guest's exported allocator
//! (`proxy_on_memory_allocate`, else `malloc`). Any out-of-bounds access is an error,
//! which wasmtime turns into a trap of the guest call (Envoy would instead return
//! `InvalidMemoryAccess`; a broken pointer is a guest bug either way).

use crate::state::HostState;
use wasmtime::error::Context as _;
use wasmtime::{bail, format_err as anyhow, Result};
use wasmtime::{Caller, Memory, TypedFunc};

/// Store data that knows its guest's memory and allocator (set after instantiation).
pub(crate) trait GuestMemory: 'static {
    /// The guest's exported `memory`.
    fn memory(&self) -> Option<Memory>;
    /// The guest's allocator, for buffers the host returns; `None` if it has none.
    fn allocator(&self) -> Option<TypedFunc<i32, i32>>;
}

impl GuestMemory for HostState {
    fn memory(&self) -> Option<Memory> {
        self.memory
    }

    fn allocator(&self) -> Option<TypedFunc<i32, i32>> {
        self.alloc.clone()
    }
}

/// Access to one guest's memory from inside a hostcall.
pub(crate) struct Guest<'a, 'c, T: 'static> {
    caller: &'a mut Caller<'c, T>,
}

impl<'a, 'c, T: GuestMemory> Guest<'a, 'c, T> {
    pub(crate) fn new(caller: &'a mut Caller<'c, T>) -> Self {
        Self { caller }
    }

    /// The store data (the host state of this VM).
    pub(crate) fn state(&mut self) -> &mut T {
        self.caller.data_mut()
    }

    fn memory(&self) -> Result<Memory> {
        self.caller
            .data()
            .memory()
            .ok_or_else(|| anyhow!("the guest exports no `memory`"))
    }

    /// Copies `len` bytes at `ptr` out of the guest.
    pub(crate) fn read(&mut self, ptr: i32, len: i32) -> Result<Vec<u8>> {
        let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
        if len == 0 {
            return Ok(Vec::new());
        }
        self.check(ptr, len)?;
        let memory = self.memory()?;
        let mut buf = vec![0u8; len];
        memory
            .read(&*self.caller, ptr, &mut buf)
            .map_err(|_| anyhow!("guest passed an out-of-bounds buffer: ptr={ptr} len={len}"))?;
        Ok(buf)
    }

    /// Fails unless `ptr..ptr+len` lies inside guest memory (checked before the host
    /// allocates anything of guest-chosen size).
    pub(crate) fn check(&self, ptr: usize, len: usize) -> Result<()> {
        let size = self.memory()?.data_size(&*self.caller);
        match ptr.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => bail!("guest passed an out-of-bounds buffer: ptr={ptr} len={len}"),
        }
    }

    /// Reads a guest string (lossy UTF-8).
    pub(crate) fn read_string(&mut self, ptr: i32, len: i32) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.read(ptr, len)?).into_owned())
    }

    /// Copies `data` into the guest at `ptr`.
    pub(crate) fn write(&mut self, ptr: i32, data: &[u8]) -> Result<()> {
        let ptr = ptr as u32 as usize;
        let memory = self.memory()?;
        memory.write(&mut *self.caller, ptr, data).map_err(|_| {
            anyhow!(
                "guest passed an out-of-bounds return pointer: ptr={ptr} len={}",
                data.len()
            )
        })
    }

    /// Writes a little-endian `u32` (a wasm32 pointer or size) at `ptr`.
    pub(crate) fn write_u32(&mut self, ptr: i32, value: u32) -> Result<()> {
        self.write(ptr, &value.to_le_bytes())
    }

    /// Writes a little-endian `u64` at `ptr`.
    pub(crate) fn write_u64(&mut self, ptr: i32, value: u64) -> Result<()> {
        self.write(ptr, &value.to_le_bytes())
    }

    /// Allocates `len` bytes with the guest's allocator and returns the guest pointer.
    fn alloc(&mut self, len: usize) -> Result<u32> {
        let alloc = self.caller.data().allocator().ok_or_else(|| {
            anyhow!("the guest exports neither proxy_on_memory_allocate nor malloc")
        })?;
        let len = i32::try_from(len).context("returned buffer too large for wasm32")?;
        let ptr = alloc
            .call(&mut *self.caller, len)
            .context("guest allocator trapped")?;
        if ptr == 0 {
            bail!("guest allocator returned NULL for {len} bytes");
        }
        Ok(ptr as u32)
    }

    /// Hands `data` to the guest like Envoy's `copyToPointerSize`: allocates a guest buffer,
    /// copies the bytes, and stores its pointer and size at `ptr_ptr` / `size_ptr`. Empty data
    /// stores a NULL pointer and size 0 (the SDK reads that as "no value"/empty).
    pub(crate) fn return_bytes(&mut self, data: &[u8], ptr_ptr: i32, size_ptr: i32) -> Result<()> {
        let ptr = if data.is_empty() {
            0
        } else {
            let ptr = self.alloc(data.len())?;
            self.write(ptr as i32, data)?;
            ptr
        };
        self.write_u32(ptr_ptr, ptr)?;
        self.write_u32(size_ptr, data.len() as u32)
    }
}
