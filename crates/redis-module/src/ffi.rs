//! The Redis module API, as much of it as the module uses: the function pointers Redis hands a
//! module at load (what `redismodule.h`'s `RedisModule_Init` fetches with `RedisModule_GetApi`),
//! and the two entry points Redis calls. All of the module's `unsafe` code is here.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_longlong, c_void};
use std::sync::OnceLock;

use crate::command::{self, Host, Read};

/// `REDISMODULE_OK` / `REDISMODULE_ERR`.
const OK: c_int = 0;
const ERR: c_int = 1;
/// `REDISMODULE_APIVER_1`.
const API_VERSION: c_int = 1;
/// `REDISMODULE_READ` / `REDISMODULE_WRITE` (modes of a key opened).
const READ: c_int = 1;
const WRITE: c_int = 2;
/// `REDISMODULE_KEYTYPE_EMPTY` / `_STRING`.
const KEYTYPE_EMPTY: c_int = 0;
const KEYTYPE_STRING: c_int = 1;

type Ctx = c_void;
type RString = c_void;
type Key = c_void;
type CommandFn = extern "C" fn(*mut Ctx, *mut *mut RString, c_int) -> c_int;

/// The API functions used, fetched once at load.
struct Api {
    create_command:
        unsafe extern "C" fn(*mut Ctx, *const c_char, CommandFn, *const c_char, c_int, c_int, c_int) -> c_int,
    set_module_attribs: unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, c_int) -> c_int,
    string_ptr_len: unsafe extern "C" fn(*const RString, *mut usize) -> *const c_char,
    reply_with_array: unsafe extern "C" fn(*mut Ctx, std::ffi::c_long) -> c_int,
    reply_with_long_long: unsafe extern "C" fn(*mut Ctx, c_longlong) -> c_int,
    reply_with_error: unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int,
    open_key: unsafe extern "C" fn(*mut Ctx, *mut RString, c_int) -> *mut Key,
    close_key: unsafe extern "C" fn(*mut Key),
    key_type: unsafe extern "C" fn(*mut Key) -> c_int,
    string_dma: unsafe extern "C" fn(*mut Key, *mut usize, c_int) -> *mut c_char,
    string_set: unsafe extern "C" fn(*mut Key, *mut RString) -> c_int,
    set_expire: unsafe extern "C" fn(*mut Key, c_longlong) -> c_int,
    create_string: unsafe extern "C" fn(*mut Ctx, *const c_char, usize) -> *mut RString,
    free_string: unsafe extern "C" fn(*mut Ctx, *mut RString),
    replicate: unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...) -> c_int,
}

static API: OnceLock<Api> = OnceLock::new();

/// Fetches `name` from Redis's table; `None` if this Redis does not have it.
unsafe fn fetch<T: Copy>(get_api: unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int, name: &CStr) -> Option<T> {
    let mut pointer: *mut c_void = std::ptr::null_mut();
    // SAFETY: GetApi writes one function pointer into `pointer`; `T` is that function's type.
    unsafe {
        if get_api(name.as_ptr(), (&raw mut pointer).cast()) != OK || pointer.is_null() {
            return None;
        }
        Some(std::mem::transmute_copy::<*mut c_void, T>(&pointer))
    }
}

/// Called by Redis when the module is loaded (`--loadmodule`, `MODULE LOAD`).
///
/// # Safety
/// Called by Redis only, with its context.
#[unsafe(no_mangle)]
#[allow(unreachable_pub)] // exported to Redis by its C name
pub unsafe extern "C" fn RedisModule_OnLoad(ctx: *mut Ctx, _argv: *mut *mut RString, _argc: c_int) -> c_int {
    // SAFETY: as `RedisModule_Init` does: the context's first word is `RedisModule_GetApi`.
    let get_api: unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int =
        unsafe { std::mem::transmute_copy(&*(ctx as *const *const c_void)) };
    macro_rules! get {
        ($name:literal) => {
            match unsafe { fetch(get_api, $name) } {
                Some(f) => f,
                None => return ERR,
            }
        };
    }
    let api = Api {
        create_command: get!(c"RedisModule_CreateCommand"),
        set_module_attribs: get!(c"RedisModule_SetModuleAttribs"),
        string_ptr_len: get!(c"RedisModule_StringPtrLen"),
        reply_with_array: get!(c"RedisModule_ReplyWithArray"),
        reply_with_long_long: get!(c"RedisModule_ReplyWithLongLong"),
        reply_with_error: get!(c"RedisModule_ReplyWithError"),
        open_key: get!(c"RedisModule_OpenKey"),
        close_key: get!(c"RedisModule_CloseKey"),
        key_type: get!(c"RedisModule_KeyType"),
        string_dma: get!(c"RedisModule_StringDMA"),
        string_set: get!(c"RedisModule_StringSet"),
        set_expire: get!(c"RedisModule_SetExpire"),
        create_string: get!(c"RedisModule_CreateString"),
        free_string: get!(c"RedisModule_FreeString"),
        replicate: get!(c"RedisModule_Replicate"),
    };
    let api = API.get_or_init(|| api);
    // SAFETY: the functions Redis just gave, with its context and NUL-terminated strings. The
    // command writes one key, its first argument.
    unsafe {
        (api.set_module_attribs)(ctx, c"tollgate".as_ptr(), 1, API_VERSION);
        (api.create_command)(ctx, c"tollgate.check".as_ptr(), check, c"write deny-oom fast".as_ptr(), 1, 1, 1)
    }
}

/// What the command sees of Redis: its arguments, the key's value, the write, the reply.
pub(crate) struct Call {
    ctx: *mut Ctx,
    argv: *mut *mut RString,
    argc: usize,
    api: &'static Api,
}

impl Call {
    fn key(&self) -> *mut RString {
        // SAFETY: the command has at least its key (its arity is checked before any call).
        unsafe { *self.argv.add(1) }
    }
}

impl Host for Call {
    /// Argument `i` (0: the command's name).
    fn arg(&self, i: usize) -> &[u8] {
        if i >= self.argc {
            return &[];
        }
        let mut len = 0;
        // SAFETY: `argv` holds `argc` strings that live for the command's call.
        unsafe {
            let pointer = (self.api.string_ptr_len)(*self.argv.add(i), &raw mut len);
            std::slice::from_raw_parts(pointer.cast::<u8>(), len)
        }
    }

    fn argc(&self) -> usize {
        self.argc
    }

    /// `GET` of the key (argument 1).
    fn get(&self) -> Read {
        // SAFETY: the key argument opened for reading, read while open (the bytes copied), closed.
        unsafe {
            let key = (self.api.open_key)(self.ctx, self.key(), READ);
            if key.is_null() {
                return Read::Missing;
            }
            let read = match (self.api.key_type)(key) {
                KEYTYPE_EMPTY => Read::Missing,
                KEYTYPE_STRING => {
                    let mut len = 0;
                    let pointer = (self.api.string_dma)(key, &raw mut len, READ);
                    if pointer.is_null() {
                        Read::Missing
                    } else {
                        Read::Value(std::slice::from_raw_parts(pointer.cast::<u8>(), len).to_vec())
                    }
                }
                _ => {
                    (self.api.reply_with_error)(
                        self.ctx,
                        c"WRONGTYPE Operation against a key holding the wrong kind of value".as_ptr(),
                    );
                    Read::Answered
                }
            };
            (self.api.close_key)(key);
            read
        }
    }

    /// The key set to `value` for `px_ms` (the key API: no command to run), replicated as
    /// `SET key value PX ms` (the module's own reading of the clock is not).
    fn set(&self, value: &str, px_ms: i64) -> bool {
        // SAFETY: the key argument opened for writing, a string created for the value and freed
        // after the key holds its copy, the key closed; then the effect replicated, format "sbcl":
        // the key argument, a buffer and its length, a C string, a long long.
        unsafe {
            let key = (self.api.open_key)(self.ctx, self.key(), READ | WRITE);
            if key.is_null() {
                return false;
            }
            let string = (self.api.create_string)(self.ctx, value.as_ptr().cast::<c_char>(), value.len());
            let written = (self.api.string_set)(key, string) == OK && (self.api.set_expire)(key, px_ms) == OK;
            (self.api.free_string)(self.ctx, string);
            (self.api.close_key)(key);
            if written {
                (self.api.replicate)(
                    self.ctx,
                    c"SET".as_ptr(),
                    c"sbcl".as_ptr(),
                    self.key(),
                    value.as_ptr().cast::<c_char>(),
                    value.len(),
                    c"PX".as_ptr(),
                    c_longlong::from(px_ms),
                );
            }
            written
        }
    }

    fn reply_integers(&self, values: &[i64]) {
        // SAFETY: an array header of `values.len()` elements, then as many integers.
        unsafe {
            (self.api.reply_with_array)(self.ctx, std::ffi::c_long::try_from(values.len()).unwrap_or(0));
            for value in values {
                (self.api.reply_with_long_long)(self.ctx, *value);
            }
        }
    }

    fn reply_error(&self, message: &str) {
        let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: a NUL-terminated message, copied by Redis.
        unsafe {
            (self.api.reply_with_error)(self.ctx, message.as_ptr());
        }
    }
}

extern "C" fn check(ctx: *mut Ctx, argv: *mut *mut RString, argc: c_int) -> c_int {
    let Some(api) = API.get() else { return ERR };
    let call = Call { ctx, argv, argc: usize::try_from(argc).unwrap_or(0), api };
    // A panic must not unwind into Redis (that would abort the server): it answers an error.
    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| command::check(&call)));
    if answered.is_err() {
        call.reply_error("ERR tollgate.check failed (a bug in tollgate's module: please report it)");
    }
    OK
}
